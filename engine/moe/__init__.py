"""Expert memory and execution: the router, the slot layout, the host expert store (source of
truth), the device expert cache shared by all MoE layers, the miss policy and the runtime."""

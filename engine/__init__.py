"""FreeToken engine: loads a converted MoE checkpoint, keeps routed experts in host RAM with a
budgeted expert cache on the compute device, and generates tokens."""

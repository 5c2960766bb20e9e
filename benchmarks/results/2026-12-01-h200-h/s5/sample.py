"""Run the freetoken CLI with every thread's stack dumped every 0.2 s (faulthandler) into argv[1]."""
import faulthandler, runpy, sys
f = open(sys.argv[1], "w")
faulthandler.dump_traceback_later(0.2, repeat=True, file=f)
sys.argv = ["freetoken"] + sys.argv[2:]
runpy.run_module("freetoken_cli.main", run_name="__main__")

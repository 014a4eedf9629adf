import signal

# Before the command line's imports (0.3 s): a run started with SIGINT ignored (`personaemp
# run &` in a script) took no Ctrl-C until cli.entry restored it, and one during them ended
# in a traceback (exit -2). The `personaemp` script imports cli.entry first: it has neither.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    from personaemp.cli import entry
except KeyboardInterrupt:  # the line of cli.interrupted
    import os
    import sys

    sys.stderr.write("Interrupted — run it again to resume\n")
    os._exit(130)

entry()

try:
    from personaemp.cli import entry
except KeyboardInterrupt:  # Ctrl-C while the program starts (the line of cli.interrupted)
    import os
    import sys

    sys.stderr.write("Interrupted — run it again to resume\n")
    os._exit(130)

entry()

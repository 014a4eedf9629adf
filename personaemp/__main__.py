from personaemp.cli import entry

entry()

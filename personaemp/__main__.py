from personaemp.cli import app

app(prog_name="personaemp")

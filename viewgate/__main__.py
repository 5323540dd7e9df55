from viewgate.cli import app

app()

import cronlock

app = cronlock.App()


@app.periodic("bad", cron="61 * * * *")
async def bad(run: cronlock.Run) -> None:
    pass

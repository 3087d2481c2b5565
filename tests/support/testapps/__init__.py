"""The apps the tests run. A module whose App tests use directly (items, chunked, jobs, sched,
health) has ``create_app()``, which builds a new App with its tasks or handlers, so that every
test has its own; its module-level ``app`` is what a command started with
``--app testapps.<module>`` loads (in its own process, or freshly imported in this one). The
others (badcron, broken, crontabapp, exits) are only ever loaded by commands."""

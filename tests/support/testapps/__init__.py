"""The apps the tests run: each module's ``create_app()`` builds a new App with its tasks or
handlers, so that every test has its own; the module-level ``app`` is what a command started
with ``--app testapps.<module>`` loads (in its own process, or freshly imported in this one)."""

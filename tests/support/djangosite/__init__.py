"""A small Django project for tests/integration/test_django.py: a ``shop`` app whose tasks
run on cronlock (``settings.TASKS``), on the database ``$DJANGOSITE_DATABASE_URL`` names.
``manage.py`` beside this file runs it as a user's project is run."""

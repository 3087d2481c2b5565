"""The ``manage.py`` commands of ``cronlock.contrib.django``."""

"""``manage.py cronlock``."""

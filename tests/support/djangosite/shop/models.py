"""What the tasks write with the ORM."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    note: models.CharField[str, str] = models.CharField(max_length=200)

    class Meta:
        app_label = "shop"

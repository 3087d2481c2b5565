"""The shop app's config."""

from __future__ import annotations

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "djangosite.shop"
    label = "shop"

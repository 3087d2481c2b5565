"""Integrations with other frameworks, each behind an extra of its own: ``import cronlock``
imports none of them (``cronlock.contrib.django``: the ``django`` extra)."""

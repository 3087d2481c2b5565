"""The project's one app: orders, and the tasks that work on them."""

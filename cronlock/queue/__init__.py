"""The job queue: jobs and the retry rule (``jobs``), enqueueing (``enqueue``), and the
drainer that claims, runs and completes them (``drainer``)."""

"""The job queue, in the order a job meets it: ``jobs`` (values, options, the backoff: pure),
``enqueue``, then the drainer (``drainer``, the small orchestrator) and its parts: ``lease``
(one active drainer per queue), ``lanes`` (claim, run, complete in one transaction),
``attempt`` (one handler run), ``complete`` (outcomes and how they are written) and
``workers`` (the heartbeat row)."""

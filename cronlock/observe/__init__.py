"""What cronlock shows of itself: a drainer's in-memory stats (``stats``), ``cronlock status``
read from the tables (``status``), and the Prometheus metrics (``prometheus``)."""

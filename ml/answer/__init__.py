"""The answer engine the server runs for `amfs_answer`: backbone loading, the memory prefix compiler, the worker."""

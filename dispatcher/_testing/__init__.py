"""The testing kit: throwaway servers, waiting with a deadline, and test data.

Not a public API. It ships in the wheel because ``dispatcher demo`` starts its
throwaway servers with it; the test suite and the benchmarks use the same
pieces, so there is one way to start a server and one way to wait.
"""

"""Reference solvers that check the search in tests: brute force and an ILP, too slow for the product."""

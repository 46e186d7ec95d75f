"""A small file for the demo: the cursor goes after `return` inside `fib`."""


def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return 


def first_fibs(count: int) -> list[int]:
    return [fib(i) for i in range(count)]

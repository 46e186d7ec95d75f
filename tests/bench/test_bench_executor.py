"""The sandboxed executor: exit status decides, limits hold, and the guard refuses what it must."""

from dgemma_lsp.bench.executor import run_program, run_programs


def test_exit_status_decides_the_outcome():
    passed, failed = run_programs(["assert sum([1, 2]) == 3\n", "assert sum([1, 2]) == 4\n"], timeout_s=30)
    assert passed.outcome == "passed"
    assert failed.outcome == "failed"


def test_an_endless_loop_is_killed_at_the_time_limit():
    assert run_program("while True:\n    pass\n", timeout_s=1).outcome == "timeout"


def _refused(statement: str) -> str:
    """A program that exits 0 only when `statement` raises PermissionError (the guard's refusal)."""
    return (
        "import os, socket, subprocess, sys\n"
        f"try:\n    {statement}\nexcept PermissionError:\n    sys.exit(0)\nsys.exit(1)\n"
    )


def test_network_processes_and_outside_writes_are_refused(tmp_path):
    outside = tmp_path / "escaped.txt"
    statements = [
        "socket.socket(socket.AF_INET, socket.SOCK_STREAM)",
        "subprocess.run(['true'])",
        "os.fork()",
        f"open({str(outside)!r}, 'w').write('x')",
        f"os.remove({str(tmp_path)!r})",
    ]
    results = run_programs([_refused(s) for s in statements], timeout_s=30)
    assert [r.outcome for r in results] == ["passed"] * len(statements)
    assert not outside.exists()


def test_writing_inside_its_own_directory_works():
    program = "open('scratch.txt', 'w').write('x')\nassert open('scratch.txt').read() == 'x'\n"
    assert run_program(program, timeout_s=30).outcome == "passed"


def test_memory_is_limited():
    program = "try:\n    bytearray(8 * 1024**3)\nexcept MemoryError:\n    raise SystemExit(0)\nraise SystemExit(1)\n"
    assert run_program(program, timeout_s=30).outcome == "passed"

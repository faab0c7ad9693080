"""Native libraries' prints (METIS's printf) go to standard error while planning, and standard output comes back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from service.native_output import native_stdout_to_stderr


def test_what_is_written_to_descriptor_1_inside_lands_on_standard_error(capfd):
    with native_stdout_to_stderr():
        os.write(1, b"from C\n")
    captured = capfd.readouterr()
    assert "from C" in captured.err and "from C" not in captured.out


def test_standard_output_is_restored_on_leaving(capfd):
    with native_stdout_to_stderr():
        pass
    os.write(1, b"after\n")
    assert "after" in capfd.readouterr().out


def test_standard_output_is_restored_when_the_body_raises(capfd):
    try:
        with native_stdout_to_stderr():
            raise RuntimeError("planning failed")
    except RuntimeError:
        pass
    os.write(1, b"after\n")
    assert "after" in capfd.readouterr().out


def test_overlapping_plans_share_one_redirection_and_the_last_to_leave_restores_it(capfd):
    first_inside, second_inside, first_left = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with native_stdout_to_stderr():
            first_inside.set()
            second_inside.wait(5)
        first_left.set()

    def second() -> None:
        first_inside.wait(5)
        with native_stdout_to_stderr():
            second_inside.set()
            first_left.wait(5)
            os.write(1, b"still redirected\n")  # the first plan has left, this one has not

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    os.write(1, b"restored\n")
    captured = capfd.readouterr()
    assert "still redirected" in captured.err
    assert "restored" in captured.out and "restored" not in captured.err


def test_a_process_with_its_standard_streams_closed_still_plans():
    # a daemon started with >&- 2>&- : nowhere to move the diagnostics, and no reason to fail
    script = (
        "import os\n"
        "from service.native_output import native_stdout_to_stderr\n"
        "os.close(1)\n"
        "os.close(2)\n"
        "with native_stdout_to_stderr():\n"
        "    planned = True\n"
        "raise SystemExit(0 if planned else 3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0

"""Fixtures: start the built `infergate-sim` binary and stop it after the test.

The binary is `$INFERGATE_SIM` if set, else `$CARGO_TARGET_DIR/debug/infergate-sim`, else
`<repo>/target/debug/infergate-sim` (build it with `cargo build -p infergate-sim`).
"""

import os
import signal
import subprocess
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def sim_binary() -> str:
    if os.environ.get("INFERGATE_SIM"):
        return os.environ["INFERGATE_SIM"]
    target = os.environ.get("CARGO_TARGET_DIR") or str(REPO / "target")
    return str(pathlib.Path(target) / "debug" / "infergate-sim")


class Sim:
    """A running simulator process and its replica base URLs."""

    def __init__(self, args, replicas):
        binary = sim_binary()
        if not os.path.exists(binary):
            pytest.fail(f"simulator binary not found at {binary}: build it or set INFERGATE_SIM")
        self.proc = subprocess.Popen(
            [binary, "--port", "0", "--replicas", str(replicas), *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.urls = []
        for k in range(replicas):
            line = self.proc.stdout.readline()
            prefix = f"replica {k}: "
            if not line.startswith(prefix):
                self.stop()
                pytest.fail(f"unexpected simulator output: {line!r}")
            self.urls.append(line[len(prefix):].strip())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def start_sim():
    """Factory: start_sim(*flags, replicas=1) -> Sim; every started simulator is stopped."""
    started = []

    def start(*args, replicas=1):
        sim = Sim(list(args), replicas)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()

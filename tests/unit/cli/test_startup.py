"""What a client command loads before its request: the CLI's own start-up time is what `gpupool ps` feels
like (docs/benchmarks.md#cli-start-up)."""

from __future__ import annotations

import ssl
import subprocess
import sys

from gpupool.client.client import tls_for


def test_a_read_only_command_loads_no_spec_models_and_no_ca_bundle() -> None:
    probe = (
        "import ssl, sys\n"
        "loaded = []\n"
        "real = ssl.SSLContext.load_verify_locations\n"
        "def counted(self, *a, **k):\n"
        "    loaded.append(a)\n"
        "    return real(self, *a, **k)\n"
        "ssl.SSLContext.load_verify_locations = counted\n"
        "sys.argv = ['gpupool', 'ps']\n"
        "import gpupool.main\n"
        "try:\n"
        "    gpupool.main.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpupool.spec.')), len(loaded))\n"
    )
    env = {"GPUPOOL_SERVER": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert "cannot reach the gpupool server at http://127.0.0.1:9" in out.stderr
    assert out.stdout.split() == ["['gpupool.spec.errors',", "'gpupool.spec.quantities']", "0"]


def test_a_spec_name_loads_its_model_on_first_use() -> None:
    probe = (
        "import sys, gpupool.spec\n"
        "before = 'gpupool.spec.workload' in sys.modules\n"
        "from gpupool.spec import WorkloadSpec, parse_workload_spec\n"
        "spec = parse_workload_spec('name: a\\ncommands: [echo hi]\\n')\n"
        "print(before, WorkloadSpec.__module__, spec.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "gpupool.spec.workload", "a"], out.stderr
    missing = subprocess.run(
        [sys.executable, "-c", "from gpupool.spec import Nothing"], capture_output=True, text=True, timeout=60
    )
    assert "cannot import name 'Nothing' from 'gpupool.spec'" in missing.stderr


def test_https_servers_are_verified_and_plain_http_needs_no_ca_bundle() -> None:
    assert tls_for("https://pool.example.com") is True
    assert tls_for("HTTPS://pool.example.com") is True
    plain = tls_for("http://127.0.0.1:8470")
    assert isinstance(plain, ssl.SSLContext)
    assert plain.verify_mode == ssl.CERT_REQUIRED and plain.check_hostname
    assert plain.get_ca_certs() == []  # trusts nothing: were TLS ever spoken, it would fail closed


def test_ctrl_c_while_the_commands_load_ends_with_130_and_no_traceback() -> None:
    """The console script imports the CLI inside its handler (gpupool.entry): Ctrl-C in the first half
    second ends the command as Ctrl-C does later, not with a screen of import frames."""
    import signal
    import time
    from pathlib import Path

    import psutil

    script = Path(sys.executable).with_name("gpupool")
    assert script.read_text().count("gpupool.entry") == 1, "reinstall the package: pip install -e ."
    process = subprocess.Popen(
        [str(script), "--help"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background suite ignores it
    )
    # The interpreter's own start costs about 0.03 s of CPU, the CLI's imports about 0.4 s: 0.1 s is inside
    # the imports, whatever the machine's load.
    watched = psutil.Process(process.pid)
    deadline = time.monotonic() + 30
    while sum(watched.cpu_times()[:2]) < 0.1 and time.monotonic() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert process.returncode == 130
    assert "Usage" not in out  # stopped before the help, not after it

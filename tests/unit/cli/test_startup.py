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
    second ends the command as Ctrl-C does later, not with a screen of import frames. The SIGINT is sent
    the moment the commands start to load (an import hook sends it to the process itself): on a fast
    machine the whole `--help` takes less CPU than any fixed wait from outside could count on."""
    import signal
    from pathlib import Path

    script = Path(sys.executable).with_name("gpupool")
    assert script.read_text().count("gpupool.entry") == 1, "reinstall the package: pip install -e ."
    interrupted = (
        "import os, runpy, signal, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'gpupool.cli.app':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        f"sys.argv = [{str(script)!r}, '--help']\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
    )
    process = subprocess.run(
        [sys.executable, "-c", interrupted],
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background suite ignores it
    )
    assert "Traceback" not in process.stderr and "KeyboardInterrupt" not in process.stderr, process.stderr
    assert process.returncode == 130, process
    assert "Usage" not in process.stdout  # stopped before the help, not after it

"""Runs SOK's own TF1/TF2 test scripts on sok1x (CPU backend) with only the import changed.

Adaptations (all mechanical, made by adapt()): the import of sparse_operation_kit becomes sok1x;
on TensorFlow 2.x TF1 scripts get tf.compat.v1 (2.x has no TF1 top level), on TensorFlow 1.x
they keep upstream's `import tensorflow as tf`; horovodrun -> mpiexec;
OMPI_* rank variables -> MPICH's PMI_*; batches 16384/65536/8192 -> 1024; iters 100 -> 10.

usage: python scripts/sok_scripts/run.py SOURCES SITE OUTDIR [filter]
    SOURCES  the folder scripts/sok_scripts/get_sources.sh made from a HugeCTR clone (v1/, v2/)
    SITE     a folder sok1x is installed in (pip install --target SITE .), put first on PYTHONPATH
    OUTDIR   where the adapted scripts, logs/ and results.tsv (one line per run) go
    filter   a regular expression over "name npRANKS" (default: every run)
Run it with the python and mpiexec of the environment that has TensorFlow, Horovod and mpi4py;
on TensorFlow 1.x the tf2 function tests are left out (they need TensorFlow 2's eager mode).
Environment: HARNESS_TIMEOUT_S (seconds a run may take, default 150), HARNESS_V1_ITERS,
HARNESS_V1_ONEDEVICE_AT_2=1 (script.sh's onedevice runs also at 2 ranks under Horovod, numbered
after the rest), HARNESS_V2_FIRST=1 (the v2 tests before the v1 ones).
summarize.py OUTDIR... prints the totals and each failure's last error line.
"""
import os
import re
import shlex
import signal
import shutil
import subprocess
import sys
import time

V1_SRC = V2_SRC = None  # set by main() from SOURCES

TIMEOUT_S = int(os.environ.get("HARNESS_TIMEOUT_S", "150"))
TF1_IMPORT = "import tensorflow.compat.v1 as tf; tf.disable_v2_behavior()"


def tensorflow_major():
    """The major version of the TensorFlow that sys.executable imports (1 or 2)."""
    out = subprocess.check_output([sys.executable, "-c",
                                   "import tensorflow as tf; print(tf.__version__)"],
                                  env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return int(out.decode().strip().splitlines()[-1].split(".")[0])


def adapt(text, tf1, tf_major=2):
    """SOK's script `text` with the mechanical changes above; `tf1`: a TF1 script, which keeps
    `import tensorflow as tf` where `tf_major` is 1."""
    text = text.replace("import sparse_operation_kit as sok", "import sok1x as sok")
    if tf1 and tf_major >= 2:
        text = re.sub(r"^import tensorflow as tf\s*$", TF1_IMPORT, text, flags=re.M)
    text = text.replace('os.getenv("OMPI_COMM_WORLD_SIZE")', 'os.getenv("PMI_SIZE")')
    text = text.replace('os.getenv("OMPI_COMM_WORLD_RANK")', 'os.getenv("PMI_RANK")')
    text = re.sub(r"^(\s*)batch_size = (8192|65536)\s*$", r"\1batch_size = 1024", text, flags=re.M)
    text = re.sub(r"^(\s*)batch = 8192\s*$", r"\1batch = 1024", text, flags=re.M)
    text = re.sub(r"^(\s*)iters = 100\s*$", r"\1iters = 10", text, flags=re.M)
    text = re.sub(r"for i in range\(100\):", "for i in range(10):", text)
    # tables of 2M and 128k rows built from Python lists: too slow on a shared 2-core host
    text = re.sub(r"^(\s*)vocab_size = 1023 \* 1024 \* 2\s*$", r"\1vocab_size = 1023 * 16", text,
                  flags=re.M)
    text = re.sub(r"^(\s*)vocab_size = 1024 \* 128\s*$", r"\1vocab_size = 1024 * 8", text,
                  flags=re.M)
    return text


def copy_tree(src, dst, tf1, tf_major):
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    for root, _, files in os.walk(dst):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path) as f:
                    text = f.read()
                text = adapt(text, tf1, tf_major)
                if path.endswith("/v1/utils.py"):
                    with open(os.path.join(os.path.dirname(__file__), "numpy_utils.py")) as g:
                        text += g.read()
                with open(path, "w") as f:
                    f.write(text)


def _script_sh_lines():
    """(argv from the script's name on, horovod?) of each test run in SOK's script.sh, batch
    1024 (HARNESS_V1_ITERS: iterations)."""
    with open(os.path.join(V1_SRC, "script.sh")) as f:
        text = f.read().replace("\\\n", " ")
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if "test_dense_emb_demo.py" not in line and "test_sparse_emb_demo.py" not in line:
            continue
        words = shlex.split(line)
        start = [i for i, w in enumerate(words) if w.endswith(".py")][0]
        argv = words[start:]
        argv = [a.replace("--global_batch_size=16384", "--global_batch_size=1024") for a in argv]
        iters = os.environ.get("HARNESS_V1_ITERS")
        if iters:
            argv = [a.replace("--iter_num=30", "--iter_num=" + iters) for a in argv]
        lines.append((argv, "horovod" in line))
    return lines


def v1_runs():
    """(name, cwd-relative dir, argv, ranks) from script.sh: the onedevice runs at 1 rank,
    the horovod runs at 1 and 2 ranks."""
    runs = []
    for argv, horovod in _script_sh_lines():
        for ranks in ([1, 2] if horovod else [1]):
            label = "v1/%s#%d" % (" ".join(argv[:1] + argv[2:]), len(runs))
            runs.append((label, "v1", argv, ranks))
    return runs


def v1_onedevice_runs_under_horovod(first_index):
    """script.sh's onedevice runs at 2 ranks under Horovod (--distributed_tool=horovod, no
    --gpu_num), which SOK's script.sh runs on one GPU only: HARNESS_V1_ONEDEVICE_AT_2=1 adds
    them after every other run, so the other runs keep their numbers."""
    runs = []
    for argv, horovod in _script_sh_lines():
        if horovod:
            continue
        argv = [a for a in argv if not a.startswith("--gpu_num")]
        argv = ["--distributed_tool=horovod" if a.startswith("--distributed_tool") else a
                for a in argv]
        label = "v1-horovod/%s#%d" % (" ".join(argv[:1] + argv[2:]), first_index + len(runs))
        runs.append((label, "v1", argv, 2))
    return runs


def v2_runs(tf_major):
    runs = []
    base = os.path.join(V2_SRC, "tf%d" % tf_major)
    for sub in sorted(os.listdir(base)):
        for name in sorted(os.listdir(os.path.join(base, sub))):
            if name.endswith(".py"):
                for ranks in (1, 2):
                    runs.append(("tf%d/%s/%s" % (tf_major, sub, name), "tf%d/%s" % (tf_major, sub),
                                 [name], ranks))
    return runs


def wait_or_kill(proc, log):
    """Waits for the job; a rank that printed a traceback gets 8 s to end (sok1x's abort can
    leave a rank stuck beside Horovod), then the job counts as failed."""
    started, failed_at = time.time(), None
    while True:
        rc = proc.poll()
        if rc is not None:
            return rc
        now = time.time()
        if now - started > TIMEOUT_S:
            return 124
        if failed_at is None:
            with open(log, errors="replace") as f:
                if "Traceback (most recent call last)" in f.read():
                    failed_at = now
        elif now - failed_at > 8:
            return 1
        time.sleep(1)


def main():
    global V1_SRC, V2_SRC
    sources, site, outdir = (os.path.abspath(a) for a in sys.argv[1:4])
    pattern = sys.argv[4] if len(sys.argv) > 4 else ""
    V1_SRC, V2_SRC = os.path.join(sources, "v1"), os.path.join(sources, "v2")
    work = os.path.join(outdir, "work")
    os.makedirs(work, exist_ok=True)
    tf_major = tensorflow_major()
    copy_tree(V1_SRC, os.path.join(work, "v1"), True, tf_major)
    copy_tree(os.path.join(V2_SRC, "tf1"), os.path.join(work, "tf1"), True, tf_major)
    copy_tree(os.path.join(V2_SRC, "tf2"), os.path.join(work, "tf2"), False, tf_major)
    v1 = v1_runs()
    runs = v1 + v2_runs(1) + v2_runs(2)
    if os.environ.get("HARNESS_V1_ONEDEVICE_AT_2"):
        runs += v1_onedevice_runs_under_horovod(len(runs))
    order = list(range(len(runs)))
    if tf_major < 2:  # SOK's tf2 function tests need TensorFlow 2's eager mode
        order = [i for i in order if runs[i][1].split("/")[0] != "tf2"]
    if os.environ.get("HARNESS_V2_FIRST"):
        order = [i for i in order if i >= len(v1)] + [i for i in order if i < len(v1)]
    env = dict(os.environ, PYTHONPATH=site, TF_CPP_MIN_LOG_LEVEL="2", SOK1X_MPI_TIMEOUT_S="60")
    results = open(os.path.join(outdir, "results.tsv"), "a")
    for index in order:
        name, sub, argv, ranks = runs[index]
        if pattern and not re.search(pattern, name + " np%d" % ranks):
            continue
        cwd = os.path.join(work, sub)
        log = os.path.join(outdir, "logs", "%03d_np%d.log" % (index, ranks))
        os.makedirs(os.path.dirname(log), exist_ok=True)
        cmd = ["mpiexec", "-n", str(ranks), "nice", sys.executable] + argv
        started = time.time()
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            rc = wait_or_kill(proc, log)
            try:  # a rank stuck after MPI_Abort, or a hang: end the whole group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if rc == 124:
                f.write("\nHARNESS: timed out after %d s\n" % TIMEOUT_S)
        with open(log) as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        reason = ""
        if rc:
            errs = [line for line in lines if re.search(r"Error|error:|assert", line)]
            reason = (errs[-1] if errs else lines[-1] if lines else "")[:200]
        results.write("%d\t%s\tnp%d\t%s\t%.0fs\t%s\n" % (index, name, ranks, "PASS" if rc == 0
                                                       else "FAIL", time.time() - started, reason))
        results.flush()


if __name__ == "__main__":
    main()

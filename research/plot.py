"""gnuplot for the experiment reports (research/experiments.py,
research/collapse_risk.py): the PNG terminal line and the run of a script.
Standard library only; no plot (and a message) without gnuplot."""
import os
import shutil
import subprocess


def available(who):
    """True when gnuplot is on PATH; else says so, as `who`."""
    if shutil.which("gnuplot"):
        return True
    print("%s: gnuplot not found (make deps installs gnuplot-nox); no plot" % who)
    return False


def terminal(width, height):
    """The 'set terminal' line for a width x height PNG: pngcairo when this
    gnuplot has it, else the plain png terminal."""
    cairo = subprocess.run(["gnuplot", "-e", "set terminal pngcairo"], capture_output=True).returncode == 0
    return ("set terminal pngcairo size %d,%d font ',10'" if cairo else "set terminal png size %d,%d") % (
        width, height)


def render(lines, scratch, who):
    """Writes lines to scratch/plot.gp and runs gnuplot on it; False (and
    gnuplot's complaint printed, as `who`) when it fails."""
    script = os.path.join(scratch, "plot.gp")
    with open(script, "w") as f:
        f.write("\n".join(lines) + "\n")
    r = subprocess.run(["gnuplot", script], capture_output=True, text=True)
    if r.returncode != 0:
        print("%s: gnuplot failed:\n%s" % (who, r.stderr))
        return False
    return True

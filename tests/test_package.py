import subprocess
import sys


def test_importing_the_package_does_not_import_matplotlib():
    code = (
        "import sys, transformer_course as tc; assert 'matplotlib' not in sys.modules, 'eager'; "
        "tc.viz.plot_attention; assert 'matplotlib.pyplot' in sys.modules, 'lazy name missing'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

"""Which C++ operation crashes an extension JIT-built on this machine? (docs/kernels.md: on the
H200 machine every error string the csrc binding built crashed the interpreter.)

Builds a tiny extension with torch.utils.cpp_extension.load_inline and calls each function in a
fresh child process; prints one line per function: ok or the signal."""
import os
import subprocess
import sys

SRC = r"""
#include <torch/extension.h>
#include <sstream>
std::string concat() { return std::string("a long error message that needs the heap: ") + std::to_string(12345); }
std::string osstream() { std::ostringstream o; o << "a long error message via ostringstream " << 12345; return o.str(); }
std::string cstr() { return c10::str("a long error message via c10::str ", 12345, " ", 1.5); }
std::string sizes() { auto t = torch::zeros({4, 32}); return c10::str("shape ", t.sizes(), " device ", t.device()); }
std::string thrown() { try { throw std::runtime_error("local throw and catch"); } catch (const std::exception& e) { return e.what(); } }
void torch_check() { TORCH_CHECK(false, "TORCH_CHECK message ", 7); }
std::tuple<torch::Tensor, std::string> pair_err() { return {torch::Tensor(), std::string("ValueError: a long error message for the pair return")}; }
"""
NAMES = ["concat", "osstream", "cstr", "sizes", "thrown", "torch_check", "pair_err"]


def main():
    if len(sys.argv) > 1:
        from torch.utils.cpp_extension import load_inline
        m = load_inline("hot_diag_cxx", cpp_sources=SRC, functions=NAMES,
                        build_directory=os.environ["DIAG_DIR"], verbose=False)
        try:
            print(repr(getattr(m, sys.argv[1])())[:80])
        except Exception as e:
            print("raised", type(e).__name__, str(e)[:60])
        return
    import torch  # noqa: F401
    from torch.utils.cpp_extension import load_inline
    d = os.environ.setdefault("DIAG_DIR", "/tmp/hot_diag_cxx")
    os.makedirs(d, exist_ok=True)
    load_inline("hot_diag_cxx", cpp_sources=SRC, functions=NAMES, build_directory=d, verbose=False)
    import torch._C as C
    print("torch", torch.__version__, "cxx11 abi", C._GLIBCXX_USE_CXX11_ABI,
          "| g++:", subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout.splitlines()[0])
    for n in NAMES:
        r = subprocess.run([sys.executable, __file__, n], capture_output=True, text=True, timeout=300)
        print(f"{n:12s} exit {r.returncode}: {(r.stdout.strip() or r.stderr.strip()[-100:])[:100]}")


if __name__ == "__main__":
    main()

"""No vendor check outside the platform modules: the core, backends, engines and plugins ask the platform.

Walks every .py file of rlcore, rlcore_fsdp, rlcore_megatron, rlcore_vllm, rlcore_sglang and plugins/
and fails, naming file and line, on code (not comments or docstrings) that talks to a vendor's API or
spells a vendor's name: ``torch.cuda``/``torch.npu``/``.cuda()``, ``torch.version.hip``, imports of
``torch_npu``, device strings such as ``"cuda"`` or ``"npu:0"``, ``"nccl"``/``"hccl"``, the
visible-devices variables, Ray's ``num_gpus``/``"GPU"``/``"NPU"``, and the platform classes
themselves (``isinstance(p, CudaPlatform)`` is a vendor check too). The CPU is no vendor: code may
say "cpu".
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import attrs

REPO = Path(__file__).resolve().parents[2]
SCANNED = ["rlcore", "rlcore_fsdp", "rlcore_megatron", "rlcore_vllm", "rlcore_sglang", "plugins"]
PLATFORM_MODULES = ["rlcore/runtime/platforms.py", "rlcore/runtime/cuda_mps.py", "rlcore_rocm/", "rlcore_ascend/"]

# The places outside the platform modules that must name platforms: the core registering its own, and
# the plugin API handing the CUDA platform to the platform plugins that extend it (rocm).
REGISTRATION_LINE = re.compile(r"^\s*(register\(|from rlcore\.runtime\.platforms import )")
ALLOWED_REGISTRATIONS = {"rlcore/builtins.py", "rlcore/api.py"}

# Vendor checks that predate the platform question answering them: (file, what) -> the fix. Passing
# until fixed, and failing once fixed, so that the entry is removed with it.
KNOWN: dict[tuple[str, str], str] = {}

VENDOR_ATTRIBUTES = {"cuda", "npu", "hip", "is_cuda", "is_npu", "cudnn"}
VENDOR_MODULES = re.compile(r"^(torch_npu|torch\.(cuda|npu|backends\.(cuda|cudnn))|pynvml|amdsmi|vllm_ascend)(\.|$)")
VENDOR_WORDS = {"cuda", "npu", "hip", "rocm", "ascend", "nccl", "hccl", "rccl", "GPU", "NPU"}
DEVICE_STRING = re.compile(r"(^|,)(cuda|npu):")
VISIBLE_DEVICES = re.compile(r"(CUDA|HIP|ROCR|ASCEND_RT)_VISIBLE_DEVICES")
PLATFORM_CLASSES = {"Platform", "CpuPlatform", "CudaPlatform", "RocmPlatform", "AscendPlatform"}

HINTS = {
    "attribute": "ask current_platform() (device_module, memory_stats, set_device, manual_seed, ...)",
    "import": "only platform plugins import vendor modules",
    "string": "use current_platform().device_type / .dist_backend / .dist_init_backend / .name",
    "visible": "use current_platform().visible_devices_env_for(...) / .reconcile_visible_devices(...)",
    "ray": "use current_platform().ray_actor_options(n)",
    "class": "use current_platform(), never a platform class",
}


@attrs.frozen
class Finding:
    path: str
    line: int
    what: str
    kind: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what} -- {HINTS[self.kind]}"


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of string constants that are docstrings or bare string statements (prose, not code)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for stmt in body if isinstance(body, list) else []:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                found.add(id(stmt.value))
    return found


def scan_source(source: str, path: str) -> list[Finding]:
    """Every vendor check in one file's code."""
    tree = ast.parse(source, filename=path)
    prose = _docstrings(tree)
    findings: list[Finding] = []

    def add(node: ast.AST, what: str, kind: str) -> None:
        findings.append(Finding(path, node.lineno, what, kind))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in VENDOR_ATTRIBUTES:
            add(node, f"`{ast.unparse(node)}`", "attribute")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if VENDOR_MODULES.match(alias.name):
                    add(node, f"`import {alias.name}`", "import")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if VENDOR_MODULES.match(node.module) or VENDOR_MODULES.match(f"{node.module}.{alias.name}"):
                    add(node, f"`from {node.module} import {alias.name}`", "import")
                elif alias.name in PLATFORM_CLASSES - {"Platform"}:
                    add(node, f"`{alias.name}`", "class")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            value = node.value
            if value in VENDOR_WORDS:
                add(node, f"string {value!r}", "ray" if value in {"GPU", "NPU"} else "string")
            elif DEVICE_STRING.search(value):
                add(node, f"device string {value!r}", "string")
            elif VISIBLE_DEVICES.search(value):
                add(node, f"string {value!r}", "visible")
        elif isinstance(node, ast.keyword) and node.arg == "num_gpus":
            add(node.value, "`num_gpus=`", "ray")
        elif isinstance(node, ast.Name) and node.id in PLATFORM_CLASSES - {"Platform"}:
            add(node, f"`{node.id}`", "class")
    return findings


def _is_platform_module(relative: str) -> bool:
    return any(relative == m or (m.endswith("/") and relative.startswith(m)) for m in PLATFORM_MODULES)


def _allowed(finding: Finding, source_lines: list[str]) -> bool:
    return finding.path in ALLOWED_REGISTRATIONS and bool(REGISTRATION_LINE.match(source_lines[finding.line - 1]))


def scan_tree(root: Path) -> tuple[list[Finding], int]:
    """Findings in every scanned package under ``root``, and how many files were read."""
    findings: list[Finding] = []
    files = 0
    for top in SCANNED:
        for file in sorted((root / top).rglob("*.py")):
            relative = file.relative_to(root).as_posix()
            if _is_platform_module(relative) or any(part in {"build", ".venv", "__pycache__"} for part in file.parts):
                continue
            source = file.read_text(encoding="utf-8")
            lines = source.splitlines()
            files += 1
            findings += [f for f in scan_source(source, relative) if not _allowed(f, lines)]
    return findings, files


def unexplained(findings: list[Finding], known: dict[tuple[str, str], str]) -> list[Finding]:
    """The findings that no entry of ``known`` excuses."""
    return [f for f in findings if (f.path, f.what) not in known]


def stale(findings: list[Finding], known: dict[tuple[str, str], str]) -> list[str]:
    """The entries of ``known`` whose vendor check is gone: fixed, so the entry must go too."""
    found = {(f.path, f.what) for f in findings}
    return [f"{path}: {what}" for path, what in known if (path, what) not in found]


def test_no_vendor_checks_outside_platform_modules():
    findings, files = scan_tree(REPO)
    assert files > 0, "the scan read no file: the package layout changed"
    findings = unexplained(findings, KNOWN)
    assert not findings, (
        f"{len(findings)} vendor check(s) outside rlcore/runtime/platforms.py, rlcore_rocm/ and rlcore_ascend/:\n"
        + "\n".join(f"  {f}" for f in findings)
    )


def test_every_known_exception_is_still_needed():
    fixed = stale(scan_tree(REPO)[0], KNOWN)
    assert not fixed, f"fixed, so remove from KNOWN in {Path(__file__).name}: {fixed}"


def test_a_known_exception_excuses_its_own_check_only_and_goes_stale_once_fixed(tmp_path):
    """KNOWN is empty today, so the two tests above hold trivially for it; here a real entry."""
    legacy = tmp_path / "rlcore_fsdp" / "legacy.py"
    legacy.parent.mkdir()
    legacy.write_text("import torch\n\ndef wait():\n    torch.cuda.synchronize()\n")
    known = {("rlcore_fsdp/legacy.py", "`torch.cuda`"): "use current_platform().synchronize()"}
    findings, files = scan_tree(tmp_path)
    assert files == 1 and [(f.path, f.what) for f in findings] == list(known)
    assert unexplained(findings, known) == [] and stale(findings, known) == []

    # a second vendor check in the same file is not excused by the first one's entry
    legacy.write_text(legacy.read_text() + "\ndef where():\n    return 'cuda'\n")
    findings, _ = scan_tree(tmp_path)
    assert [f.what for f in unexplained(findings, known)] == ["string 'cuda'"]

    # once the check is fixed, its entry is reported as stale
    legacy.write_text("from rlcore.runtime.platforms import current_platform\n\ndef wait():\n"
                      "    current_platform().synchronize()\n")
    findings, _ = scan_tree(tmp_path)
    assert findings == [] and stale(findings, known) == ["rlcore_fsdp/legacy.py: `torch.cuda`"]


def test_the_platform_modules_themselves_are_where_vendor_checks_live():
    """The scan is not vacuous: run on the platform modules it finds what they legitimately hold."""
    for module in ["rlcore/runtime/platforms.py", "rlcore_rocm/platform.py", "rlcore_ascend/platform.py"]:
        source = (REPO / module).read_text(encoding="utf-8")
        assert scan_source(source, module), module


SEEDED = '''\
"""A docstring may say torch.cuda, "cuda" and CUDA_VISIBLE_DEVICES: prose is not a check."""
import os
import torch
import torch_npu
from torch.cuda import amp
from rlcore.runtime.platforms import CudaPlatform

# a comment may say torch.cuda.is_available() too


def place(model, rank):
    if torch.cuda.is_available():
        model = model.cuda()
    torch.version.hip
    device = torch.device(f"npu:{rank}")
    os.environ["HIP_VISIBLE_DEVICES"] = str(rank)
    torch.distributed.init_process_group(backend="nccl")
    worker = Worker.options(num_gpus=1)
    bundle = {"NPU": 1}
    if isinstance(platform, CudaPlatform):
        pass
    if platform.device_type == "cpu":
        pass
    if current_platform().name != "rocm":
        pass
    return "cpu:gloo,cuda:nccl"
'''

EXPECTED = {
    4: "import",  # import torch_npu
    5: "import",  # from torch.cuda import amp
    6: "class",  # from rlcore.runtime.platforms import CudaPlatform
    12: "attribute",  # torch.cuda.is_available
    13: "attribute",  # model.cuda()
    14: "attribute",  # torch.version.hip
    15: "string",  # f"npu:{rank}"
    16: "visible",
    17: "string",  # "nccl"
    18: "ray",  # num_gpus=
    19: "ray",  # "NPU"
    20: "class",  # isinstance(..., CudaPlatform)
    24: "string",  # current_platform().name != "rocm"
    26: "string",  # "cpu:gloo,cuda:nccl"
}


def test_the_scan_finds_seeded_vendor_checks_by_file_and_line():
    findings = scan_source(SEEDED, "rlcore_fsdp/seeded.py")
    found = {(f.line, f.kind) for f in findings}
    assert found >= set(EXPECTED.items())
    assert {f.line for f in findings} == set(EXPECTED), "a docstring, comment or plain line was flagged"
    assert str(next(f for f in findings if f.line == 12)).startswith("rlcore_fsdp/seeded.py:12: `torch.cuda")


def test_registration_lines_are_the_only_exception(tmp_path):
    (tmp_path / "rlcore").mkdir()
    (tmp_path / "rlcore" / "builtins.py").write_text(
        'from rlcore.runtime.platforms import CpuPlatform, CudaPlatform\n'
        'register("cuda", CudaPlatform)\n'
        'if platform.device_type == "cuda":\n    pass\n'
    )
    findings, _ = scan_tree(tmp_path)
    assert [f.line for f in findings] == [3]  # the branch on "cuda"

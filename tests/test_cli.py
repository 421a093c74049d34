"""The ``onnax`` command line: every subcommand on small models, --check, and error handling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from onnax.cli import main, parse_axes, parse_dims

F64 = ir.DataType.DOUBLE


def _loss_model(dtype: ir.DataType = F64, batch: int | str = 3) -> ir.Model:
    x = ir.val("x", dtype, [batch, 2])
    w = ir.val("w", dtype, [2])
    tape = ir.tape.Tape()
    y = tape.op("Tanh", [tape.op("Mul", [x, w])])
    y.name = "y"
    loss = tape.op("ReduceSum", [tape.op("Mul", [y, y])], {"keepdims": 0})
    loss.name = "loss"
    graph = ir.Graph([x, w], [y, loss], nodes=tape.nodes, opset_imports={"": 18}, name="m")
    return ir.Model(graph, ir_version=10)


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    ir.save(_loss_model(), path)
    return path


@pytest.mark.parametrize(
    ("command", "extra", "added"),
    [
        ("jvp", ["--inputs", "x"], ["fwd_y", "fwd_loss"]),
        ("vjp", ["--outputs", "y"], ["adj_x", "adj_w"]),
        ("grad", ["--output", "loss"], ["grad_x", "grad_w"]),
        ("jacfwd", ["--inputs", "w"], ["jac_y_w", "jac_loss_w"]),
        ("jacrev", ["--outputs", "loss"], ["jac_loss_x", "jac_loss_w"]),
        ("hessian", ["--inputs", "w"], ["hess_loss_w_w"]),
        ("vmap", ["--in-axes", "x=0,w=None", "--axis-size", "4"], []),
    ],
)
def test_transforms_with_check(
    model_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    extra: list[str],
    added: list[str],
) -> None:
    out = tmp_path / "out.onnx"
    assert main([command, str(model_path), str(out), "--check", *extra]) == 0
    printed = capsys.readouterr()
    result = ir.load(out)
    names = [v.name for v in result.graph.outputs]
    assert names[:2] == ["y", "loss"] and names[2:] == added
    assert "|err|" in printed.out and "tolerance" in printed.out and "FAIL" not in printed.out
    assert printed.out.count(" ok") >= max(1, len(added))
    assert "onnax [" in printed.err  # progress


def test_vmap_axes_by_position(
    model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.onnx"
    assert (
        main(
            [
                "vmap",
                str(model_path),
                str(out),
                "--in-axes",
                "1,None",
                "--out-axes=-1",
                "--check",
                "--quiet",
            ]
        )
        == 0
    )
    printed = capsys.readouterr()
    assert printed.err == ""
    assert [str(d) for d in ir.load(out).graph.inputs[0].shape.dims] == ["3", "batch", "2"]
    assert "FAIL" not in printed.out


def test_parse_axes_and_dims() -> None:
    assert parse_axes(None) == 0
    assert parse_axes("None") is None
    assert parse_axes("0,None,-1") == (0, None, -1)
    assert parse_axes("x=0,w=None") == {"x": 0, "w": None}
    assert parse_dims(["N=4", "M=symbolic"]) == {"N": 4, "M": None}


def test_info(model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(model_path)]) == 0
    out = capsys.readouterr().out
    assert "x                        DOUBLE   [3, 2]" in out
    assert "loss                     DOUBLE   []" in out
    assert "opsets {'': 18}" in out
    assert "Tanh" in out and "lacking jvp rules: none" in out


def test_info_names_missing_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = ir.val("x", F64, [3])
    tape = ir.tape.Tape()
    y = tape.op("Foo", [x], domain="custom.domain")
    y.name = "y"
    model = ir.Model(
        ir.Graph([x], [y], nodes=tape.nodes, opset_imports={"": 18, "custom.domain": 1}, name="g"),
        ir_version=10,
    )
    path = tmp_path / "c.onnx"
    ir.save(model, path)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "lacking jvp rules: custom.domain::Foo" in out
    assert "lacking vmap rules: custom.domain::Foo" in out


def test_family(model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "gen" / "f.onnx"
    assert (
        main(["family", str(model_path), str(target), "--kinds", "adj,fwd_adj,fwd", "--check"]) == 0
    )
    out = capsys.readouterr().out
    assert sorted(p.name for p in target.parent.iterdir()) == [
        "adj_f.onnx",
        "f.onnx",
        "fwd_adj_f.onnx",
        "fwd_f.onnx",
    ]
    assert "contract check: ok" in out and "differentiable inputs ['x', 'w']" in out


def test_family_onnx_layout_and_dims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "n.onnx"
    ir.save(_loss_model(batch="N"), source)
    target = tmp_path / "f.onnx"
    assert main(["family", str(source), str(target)]) == 2
    err = capsys.readouterr().err
    assert "symbolic dimensions ['N']" in err and "--dim NAME=4" in err
    assert not target.exists()
    assert main(["family", str(source), str(target), "--dim", "N=5", "--layout", "onnx"]) == 0
    adj = ir.load(tmp_path / "adj_f.onnx").graph
    assert [str(d) for d in adj.inputs[2].shape.dims] == ["5", "2", "nadj"]


def test_errors_exit_2_with_one_paragraph(
    model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.onnx"
    assert main(["vjp", str(model_path), str(out), "--inputs", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("onnax vjp: no graph input or initializer named 'nope'")
    assert "Traceback" not in "\n".join(err)
    assert main(["jvp", str(tmp_path / "missing.onnx"), str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["info", str(bad)]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["vmap", str(model_path), str(out), "--in-axes", "0,x"]) == 2
    assert "an axis must be an integer or None" in capsys.readouterr().err


def test_debug_shows_the_traceback(
    model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["--debug", "grad", str(model_path), str(tmp_path / "o.onnx"), "--output", "y"]) == 2
    )
    err = capsys.readouterr().err
    assert "Traceback" in err and "SelectionError" in err
    assert (
        main(["grad", str(model_path), str(tmp_path / "o.onnx"), "--output", "y", "--debug"]) == 2
    )
    assert "Traceback" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["jvp"])
    assert exc.value.code == 2


def test_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    assert "all derivatives agree" in capsys.readouterr().out


def test_float32_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "m32.onnx"
    ir.save(_loss_model(ir.DataType.FLOAT), source)
    assert main(["hessian", str(source), str(tmp_path / "h.onnx"), "--inputs", "w", "--check"]) == 0
    assert "FAIL" not in capsys.readouterr().out
    np.testing.assert_equal(ir.load(tmp_path / "h.onnx").graph.outputs[2].dtype, ir.DataType.FLOAT)


def test_check_inconclusive_exits_3_and_says_it_is_no_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "sin.onnx"
    ir.save(
        ir.from_onnx_text(
            '<ir_version: 10, opset_import: ["" : 18]>\n'
            "g (double[4] x) => (double[4] y) { k = Constant <value = double {100000.0}> ()\n"
            " s = Mul(x, k)\n y = Sin(s) }"
        ),
        source,
    )
    assert main(["jvp", str(source), str(tmp_path / "j.onnx"), "--check", "--quiet"]) == 3
    printed = capsys.readouterr()
    assert "inconclusive" in printed.out and "FAIL" not in printed.out
    assert "onnax jvp: --check inconclusive at this point for ['fwd_y']" in printed.err
    assert "This is not a failure" in printed.err and "--check-seed 1" in printed.err


def test_check_failure_names_rows_and_exits_2(
    model_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import onnax.api
    from test_check import corrupt

    real = onnax.api.jvp
    monkeypatch.setattr(onnax.api, "jvp", lambda *a: corrupt(real(*a), "fwd_y", "scale"))
    assert main(["jvp", str(model_path), str(tmp_path / "j.onnx"), "--check", "--quiet"]) == 2
    printed = capsys.readouterr()
    assert "FAIL" in printed.out
    assert "onnax jvp: --check: ['fwd_y'] disagree with their reference" in printed.err
    assert "finite differences of the source" in printed.err and "please report it" in printed.err


@pytest.mark.parametrize("command", ["jvp", "vjp", "jacrev", "grad"])
def test_check_with_a_weight_in_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """jvp crashed with KeyError: 'net.0.weight'; vjp and jacrev compared nothing."""
    source = tmp_path / "w.onnx"
    model = _loss_model()
    # w as an initializer, as exporters store weights
    w = model.graph.inputs.pop(1)
    w.const_value = ir.tensor(np.array([0.3, -0.7]))
    model.graph.register_initializer(w)
    ir.save(model, source)
    extra = ["--output", "loss"] if command == "grad" else []
    code = main(
        [command, str(source), str(tmp_path / "o.onnx"), "--inputs", "w", "--check", *extra]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "nothing compared" not in out and out.count(" ok") >= 1


def test_version_and_python_m(capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    import onnax

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"onnax {onnax.__version__}"
    done = subprocess.run(
        [sys.executable, "-m", "onnax", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == f"onnax {onnax.__version__}"


def test_closed_pipe_is_quiet(
    model_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``onnax info m.onnx | head``: the reader leaves early; no BrokenPipeError, no traceback."""

    class ClosedPipe:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", ClosedPipe())
    assert main(["info", str(model_path)]) == 0
    assert "BrokenPipe" not in capsys.readouterr().err


def test_closed_pipe_in_a_real_process(model_path: Path) -> None:
    """The reader is gone before the first line: the write fails with EPIPE, as under ``| head``."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "onnax", "info", str(model_path)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    finally:
        os.close(write_end)
    assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0


def test_unroll_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "scan.onnx"
    ir.save(
        ir.from_onnx_text(
            '<ir_version: 10, opset_import: ["" : 18]>\n'
            "g (float[2] s0, float[3, 2] xs) => (float[2] s, float[3, 2] ys) {\n"
            " s, ys = Scan <num_scan_inputs = 1, body = b (float[2] a, float[2] x) => "
            "(float[2] c, float[2] d) { c = Add(a, x)\n d = Identity(c) }> (s0, xs) }"
        ),
        source,
    )
    out = tmp_path / "flat.onnx"
    assert main(["unroll", str(source), str(out), "--quiet"]) == 0
    assert "Scan/Loop nodes 1 -> 0" in capsys.readouterr().out
    assert not [n for n in ir.load(out).graph if n.op_type == "Scan"]
    assert main(["unroll", str(source), str(source)]) == 2
    assert "would overwrite the source" in capsys.readouterr().err


def test_check_that_compares_nothing_is_no_pass(
    model_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It printed "(nothing to compare ...)" and exited 0, as if the result had been checked."""
    import onnax.api

    monkeypatch.setattr(onnax.api, "jvp", lambda model, *a: model.clone())
    assert main(["jvp", str(model_path), str(tmp_path / "j.onnx"), "--check", "--quiet"]) == 3
    printed = capsys.readouterr()
    assert "nothing compared" in printed.out
    assert "--check compared nothing" in printed.err and "--inputs" in printed.err


def test_a_subcommand_is_one_module_and_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """How `onnax train-step` (or any new command) plugs in: a module with `register`."""
    import sys
    import types

    import onnax.cli

    module = types.ModuleType("onnax_test_hello")

    def register(sub: object, common: object) -> None:
        p = sub.add_parser("hello", help="say hello", parents=[common])  # type: ignore[attr-defined]
        p.add_argument("name")
        p.set_defaults(func=lambda args, progress: print(f"hello {args.name}") or 0)

    module.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "onnax_test_hello", module)
    monkeypatch.setattr(onnax.cli, "SUBCOMMANDS", (*onnax.cli.SUBCOMMANDS, "onnax_test_hello"))
    assert main(["hello", "world", "--quiet"]) == 0
    assert capsys.readouterr().out == "hello world\n"

"""The generated protobuf code is build output: current with proto/, regenerated when stale."""

from __future__ import annotations

import shutil
from pathlib import Path

from splitfed.transport import protogen
from splitfed.transport._codegen import GEN_DIR, PROTO_ROOT
from splitfed.transport.pb import SERVICE, pb
from splitfed.transport.server import TierServicer


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def test_generated_code_is_current() -> None:
    assert protogen.stale_reason() is None


def test_generated_code_is_what_protoc_makes_now(tmp_path: Path) -> None:
    protogen.generate(PROTO_ROOT, tmp_path, force=True)
    assert _files(tmp_path / "splitfed") == _files(GEN_DIR)


def test_a_changed_proto_makes_the_code_stale_and_is_regenerated(tmp_path: Path) -> None:
    root, out = tmp_path / "proto", tmp_path / "out"
    shutil.copytree(PROTO_ROOT, root)
    assert protogen.stale_reason(root, out) == "generated code is missing"
    assert protogen.generate(root, out)
    assert protogen.stale_reason(root, out) is None
    assert not protogen.generate(root, out)  # current: nothing to do
    proto = root / "splitfed" / "v1" / "tier.proto"
    proto.write_text(proto.read_text().replace("message Ack {}", "message Ack { string note = 1; }"))
    assert "changed" in (protogen.stale_reason(root, out) or "")
    assert protogen.generate(root, out)
    assert "string note" not in (GEN_DIR / "v1" / "tier_pb2.pyi").read_text()
    assert "note" in (out / "splitfed" / "v1" / "tier_pb2.pyi").read_text()


def test_an_installed_package_without_proto_sources_uses_its_built_code(tmp_path: Path) -> None:
    assert protogen.stale_reason(tmp_path / "no-proto", GEN_DIR.parent) is None
    assert "no generated code" in (protogen.stale_reason(tmp_path / "no-proto", tmp_path) or "")


def test_the_servicer_serves_exactly_the_service_of_the_proto() -> None:
    service = pb.DESCRIPTOR.services_by_name["Tier"]
    handler = TierServicer(None, None).handler()  # type: ignore[arg-type]
    for m in service.methods:
        details = type("D", (), {"method": f"/{SERVICE}/{m.name}"})()
        h = handler.service(details)
        assert h is not None, m.name
        assert (h.request_streaming, h.response_streaming) == (m.client_streaming, m.server_streaming), m.name
    assert handler.service(type("D", (), {"method": f"/{SERVICE}/Nope"})()) is None


def test_protogen_says_when_importing_it_regenerated_the_code(monkeypatch, capsys) -> None:
    """On a fresh clone, ``python -m splitfed.transport.protogen`` imports splitfed.transport, which generates
    the code; protogen then said "generated code is current" as if nothing had been done."""
    from splitfed.transport import _codegen

    monkeypatch.setattr(_codegen, "_checked", False)
    monkeypatch.setattr(_codegen, "regenerated_at_import", None)
    monkeypatch.setattr(_codegen, "stale_reason", lambda: "generated code is missing")
    monkeypatch.setattr(_codegen, "generate", lambda: True)  # the real code is never touched here
    _codegen.ensure()  # what importing splitfed.transport does
    assert _codegen.regenerated_at_import == "generated code is missing"
    monkeypatch.undo()
    monkeypatch.setattr(_codegen, "regenerated_at_import", "generated code is missing")
    for argv in ([], ["--check"]):
        assert protogen.main(argv) == 0
        assert capsys.readouterr().out == f"generated {GEN_DIR} when splitfed.transport was imported " \
                                          "(generated code is missing); it is current\n"
    monkeypatch.setattr(_codegen, "regenerated_at_import", None)
    assert protogen.main([]) == 0 and capsys.readouterr().out == "generated code is current\n"

"""axe-core (Deque's accessibility engine, MPL-2.0), pinned: the browser tests run it in each page they open and
fail on a serious or critical violation. It is a test tool, never served by metaledger: fetched once from npm's
registry into build/ and checked against the registry's published SHA-512 before use (as pip checks a hash)."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import urllib.request
from pathlib import Path

VERSION = "4.14.1"
TARBALL = f"https://registry.npmjs.org/axe-core/-/axe-core-{VERSION}.tgz"
INTEGRITY = "sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ=="
CACHE = Path(__file__).resolve().parents[2] / "build" / f"axe-core-{VERSION}" / "axe.min.js"
IMPACTS_THAT_FAIL = ("serious", "critical")


def axe_source() -> str:
    """axe.min.js, fetched and verified on first use."""
    if not CACHE.exists():
        with urllib.request.urlopen(TARBALL, timeout=60) as answer:
            packed = answer.read()
        digest = "sha512-" + base64.b64encode(hashlib.sha512(packed).digest()).decode()
        assert digest == INTEGRITY, f"{TARBALL} is not the published axe-core {VERSION}: {digest}"
        with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as archive:
            member = archive.extractfile("package/axe.min.js")
            assert member is not None
            CACHE.parent.mkdir(parents=True, exist_ok=True)
            CACHE.write_bytes(member.read())
    return CACHE.read_text()


def serious_violations(driver) -> list[str]:
    """Run axe in the page the Selenium `driver` shows (WebDriver's script evaluation is not bound by the page's
    Content-Security-Policy, so the page needs no exception for it); each serious or critical violation, described."""
    driver.execute_script(axe_source())
    found = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations), e => done(String(e)));"
    )
    assert isinstance(found, list), found
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — " + "; ".join(n["target"][0] for n in v["nodes"][:3])
        for v in found
        if v.get("impact") in IMPACTS_THAT_FAIL
    ]

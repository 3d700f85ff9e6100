"""Container images built on this machine (no registry is reachable), as OCI archives: the node's pause
and base images, and the routing rig's Endpoint Picker and Envoy images.

Each function returns the path of an OCI archive (``oci-layout``, ``index.json``, ``blobs/``) that
``RealNode.import_image`` loads into the node's containerd. Archives are cached under
``~/.cache/neuronfleet/images`` by a key that hashes everything that goes into them, so an image is
rebuilt only when its recipe changes.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from neuronfleet.devcluster.errors import RigError
from neuronfleet.devcluster.process.tools import ToolsMissingError, bin_dir, cache_root

#: The image references the node's pods use (``imagePullPolicy: Never``: nothing is pulled).
PAUSE_IMAGE = "localhost/neuronfleet/pause:local"
BASE_IMAGE = "localhost/neuronfleet/base:bookworm"

#: The base image's non-root user. The image itself runs as root, as python:3.11-slim does, so the
#: Dockerfile's build stages on it can install; its images and the node's pods choose this user.
BASE_USER_UID = 1000
BASE_IMAGE_USER = "0:0"
#: bookworm's Python is 3.11, the version the project supports; pip and venv for images built on it.
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "ca-certificates")
BASE_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    # Debian marks its Python externally managed (PEP 668); images built on this one install with pip.
    "PIP_BREAK_SYSTEM_PACKAGES=1",
    "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
)
#: The pause process runs as nobody, as registry.k8s.io/pause does.
PAUSE_USER = "65535:65535"

#: The routing rig's images, their versions the pins' (``tools/gie/go.mod``, ``tools/envoy/requirements.txt``).
PICKER_IMAGE = "localhost/neuronfleet/epp:v1.5.0"
ENVOY_IMAGE = "localhost/neuronfleet/envoy:1.40.0"
#: GIE's own image is distroless and runs as its ``nonroot`` user; Envoy's runs as uid 101.
PICKER_USER = "65532:65532"
ENVOY_USER = "101:101"
#: The picker's root filesystem besides ``/epp``: a user database naming its user, and the CA bundle a
#: distroless image has (the picker trusts the ServiceAccount's CA for the apiserver; this is for anything else).
_PICKER_PASSWD = b"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
_PICKER_GROUP = b"root:x:0:\nnonroot:x:65532:\n"
_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

#: Bumped when the archive layout written here changes, so old cached archives are not reused.
#: 2: the config has a history entry per layer (buildah's layered builds need one on their base image).
_FORMAT = "2"
_LAYER = "application/vnd.oci.image.layer.v1.tar"


def cache_dir() -> Path:
    """Where built archives are kept (``$NEURONFLEET_CACHE/images``)."""
    return cache_root() / "images"


def content_key(*parts: str | bytes) -> str:
    """A short hash of an image's recipe: every input, in order."""
    digest = hashlib.sha256(_FORMAT.encode())
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()[:16]


def image_config(
    layer_digest: str, *, user: str, env: tuple[str, ...] = (), created_by: str = "written by hand", **process: Any
) -> dict[str, Any]:
    """An OCI image config with one layer (``layer_digest`` is its uncompressed sha256), made by ``created_by``.

    The history's one entry matters: buildah's layered builds (``--layers``) count an image's non-empty
    history entries against its layers, and refuse a base image that has none ("history lists 1 non-empty
    layers, but we have 2 layers on disk").
    """
    config: dict[str, Any] = {"User": user, "Env": list(env), **process}
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created_by": created_by}],
    }


def _sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest(), path.stat().st_size


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    archive.addfile(info, io.BytesIO(data))


def write_oci_archive(path: Path, reference: str, layer: Path, **config: Any) -> Path:
    """Write a one-layer image named ``reference`` (layer: an uncompressed root filesystem tar) to ``path``."""
    layer_digest, layer_size = _sha256_file(layer)
    config_blob = json.dumps(image_config(layer_digest, **config), sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": f"sha256:{hashlib.sha256(config_blob).hexdigest()}",
            "size": len(config_blob),
        },
        "layers": [{"mediaType": _LAYER, "digest": f"sha256:{layer_digest}", "size": layer_size}],
    }
    manifest_blob = json.dumps(manifest, sort_keys=True).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": manifest["mediaType"],
                "digest": f"sha256:{hashlib.sha256(manifest_blob).hexdigest()}",
                "size": len(manifest_blob),
                # containerd names the imported image after this annotation.
                "annotations": {"org.opencontainers.image.ref.name": reference, "io.containerd.image.name": reference},
            }
        ],
    }
    with tarfile.open(path, "w") as archive:
        _add_bytes(archive, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_bytes(archive, "index.json", json.dumps(index).encode())
        for blob in (config_blob, manifest_blob):
            _add_bytes(archive, f"blobs/sha256/{hashlib.sha256(blob).hexdigest()}", blob)
        archive.add(layer, f"blobs/sha256/{layer_digest}")
    return path


def _cached(name: str, key: str, build: Callable[[Path, Path], None], log: Callable[[str], None]) -> Path:
    """The archive ``<name>-<key>.oci.tar`` from the cache, built by ``build(archive, scratch)`` if missing."""
    target = cache_dir() / f"{name}-{key}.oci.tar"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"==> image {name}: building into {target}")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as scratch:
        staging = Path(scratch) / "image.oci.tar"
        build(staging, Path(scratch))
        # Renamed whole: a reader never sees half an archive.
        staging.replace(target)
    size = target.stat().st_size / 2**20
    log(f"==> image {name}: done in {time.monotonic() - start:.0f} s ({size:.0f} MiB)")
    return target


def _print(message: str) -> None:
    print(message, flush=True)


def pause_image(log: Callable[[str], None] = _print) -> Path:
    """The sandbox image: ``pause.c`` compiled static, alone in its root filesystem."""
    source = resources.files(__package__).joinpath("pause.c").read_bytes()
    compile_flags = ("-Os", "-static", "-s")
    key = content_key(source, *compile_flags, PAUSE_IMAGE, PAUSE_USER)

    def build(archive: Path, scratch: Path) -> None:
        (scratch / "pause.c").write_bytes(source)
        binary = scratch / "pause"
        _run(["gcc", *compile_flags, "-o", str(binary), str(scratch / "pause.c")], "compiling pause.c")
        rootfs = scratch / "rootfs.tar"
        with tarfile.open(rootfs, "w") as layer:
            info = layer.gettarinfo(str(binary), "pause")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o755
            with binary.open("rb") as stream:
                layer.addfile(info, stream)
        made_by = f"gcc {' '.join(compile_flags)} pause.c"
        write_oci_archive(archive, PAUSE_IMAGE, rootfs, user=PAUSE_USER, created_by=made_by, Entrypoint=["/pause"])

    return _cached("pause", key, build, log)


def _base_argv(rootfs: Path) -> list[str]:
    create_user = f'chroot "$1" useradd --uid {BASE_USER_UID} --create-home --shell /bin/sh app'
    return [
        "mmdebstrap",
        "--variant=minbase",
        f"--include={','.join(BASE_PACKAGES)}",
        f"--customize-hook={create_user}",
        "--quiet",
        "bookworm",
        str(rootfs),
    ]


def base_image(log: Callable[[str], None] = _print) -> Path:
    """Debian bookworm (minbase) with Python 3.11, pip and venv, and user ``app`` (uid 1000) for what runs on it.

    Built with mmdebstrap from the machine's configured Debian mirror (first time: ~2 min, ~250 MB).
    """
    argv = _base_argv(Path("rootfs.tar"))
    key = content_key(*argv, BASE_IMAGE, *BASE_ENV, str(BASE_USER_UID), BASE_IMAGE_USER)

    def build(archive: Path, scratch: Path) -> None:
        rootfs = scratch / "rootfs.tar"
        _run(_base_argv(rootfs), "mmdebstrap of the base image", timeout=1800)
        made_by = " ".join(_base_argv(Path("rootfs.tar")))
        write_oci_archive(
            archive, BASE_IMAGE, rootfs, user=BASE_IMAGE_USER, env=BASE_ENV, created_by=made_by, Cmd=["python3"]
        )

    return _cached("base", key, build, log)


def _sha256(path: Path) -> str:
    return _sha256_file(path)[0]


def _tool_binary(kind: str, name: str) -> Path:
    binary = bin_dir(kind) / name
    if not binary.is_file():
        raise ToolsMissingError(f"{binary} is not built: run `make tool-{kind}`")
    return binary


#: A root filesystem entry: its path, mode, and content (a file to copy, bytes, or None for a directory).
_Entry = tuple[str, int, Path | bytes | None]


def _write_layer(rootfs: Path, entries: list[_Entry]) -> None:
    """An uncompressed layer of these entries, owned by root and dated 0, so equal inputs give equal bytes."""
    with tarfile.open(rootfs, "w") as layer:
        for name, mode, content in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if content is None:
                info.type = tarfile.DIRTYPE
                layer.addfile(info)
            elif isinstance(content, bytes):
                info.size = len(content)
                layer.addfile(info, io.BytesIO(content))
            else:
                info.size = content.stat().st_size
                with content.open("rb") as stream:
                    layer.addfile(info, stream)


_PICKER_ENV = ("SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",)
_PICKER_ENTRYPOINT = "/epp"


def _picker_entries(epp: Path, ca_bundle: Path) -> list[_Entry]:
    return [
        ("epp", 0o755, epp),
        ("tmp", 0o1777, None),
        ("etc", 0o755, None),
        ("etc/passwd", 0o644, _PICKER_PASSWD),
        ("etc/group", 0o644, _PICKER_GROUP),
        ("etc/ssl", 0o755, None),
        ("etc/ssl/certs", 0o755, None),
        ("etc/ssl/certs/ca-certificates.crt", 0o644, ca_bundle),
    ]


def picker_key(epp: Path, ca_bundle: Path = _CA_BUNDLE) -> str:
    """The picker image's content key: every file's path, mode and bytes, the environment, the entrypoint,
    the user and the reference."""
    files = [
        f"{name} {mode:o} {_sha256(content) if isinstance(content, Path) else content!r}"
        for name, mode, content in _picker_entries(epp, ca_bundle)
    ]
    return content_key(*files, *_PICKER_ENV, _PICKER_ENTRYPOINT, PICKER_IMAGE, PICKER_USER)


def picker_image(epp: Path | None = None, log: Callable[[str], None] = _print) -> Path:
    """GIE's Endpoint Picker (``tools/gie``'s static ``epp``, or ``epp``) alone in its root filesystem, as its
    distroless image has it: ``/epp``, a writable ``/tmp``, the CA bundle, and user ``nonroot`` (65532)."""
    binary = epp if epp is not None else _tool_binary("gie", "epp")

    def build(archive: Path, scratch: Path) -> None:
        rootfs = scratch / "rootfs.tar"
        _write_layer(rootfs, _picker_entries(binary, _CA_BUNDLE))
        write_oci_archive(
            archive,
            PICKER_IMAGE,
            rootfs,
            user=PICKER_USER,
            env=_PICKER_ENV,
            created_by="the tools/gie epp binary, copied",
            Entrypoint=[_PICKER_ENTRYPOINT],
        )

    return _cached("epp", picker_key(binary), build, log)


_ENVOY_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
_ENVOY_ENTRYPOINT = "/usr/local/bin/envoy"


def _envoy_argv(envoy: Path, rootfs: Path) -> list[str]:
    uid, gid = ENVOY_USER.split(":")
    create_user = (
        f'chroot "$1" groupadd --system --gid {gid} envoy && chroot "$1" useradd --system --uid {uid} '
        f"--gid {gid} --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin envoy"
    )
    return [
        "mmdebstrap",
        "--variant=minbase",
        # /usr merged by mmdebstrap's hook, not by the usrmerge package, which brings 50 MB of Perl along.
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        # Documentation and translations: nothing a proxy reads.
        *(f"--dpkgopt=path-exclude=/usr/share/{folder}/*" for folder in ("doc", "man", "info", "locale")),
        f"--customize-hook=copy-in {envoy} /usr/local/bin",
        f"--customize-hook={create_user}",
        "--quiet",
        "bookworm",
        str(rootfs),
    ]


def envoy_key(envoy: Path) -> str:
    """The Envoy image's content key: the binary's bytes, the mmdebstrap recipe, the environment, the
    entrypoint, the user and the reference."""
    argv = _envoy_argv(Path("envoy"), Path("rootfs.tar"))
    return content_key(_sha256(envoy), *argv, *_ENVOY_ENV, _ENVOY_ENTRYPOINT, ENVOY_IMAGE, ENVOY_USER)


def envoy_image(envoy: Path | None = None, log: Callable[[str], None] = _print) -> Path:
    """Debian bookworm (minbase, no Python) with ``tools/envoy``'s binary (or ``envoy``, a file of that name)
    at ``/usr/local/bin/envoy``, run as user ``envoy`` (uid 101, as Envoy's own image does).

    Built with mmdebstrap from the machine's configured Debian mirror (first time: ~1-2 min).
    """
    binary = envoy if envoy is not None else _tool_binary("envoy", "envoy")
    if binary.name != "envoy":
        raise ImageBuildError(f"{binary}: copy-in keeps the file's name, and the image's entrypoint is envoy")

    def build(archive: Path, scratch: Path) -> None:
        rootfs = scratch / "rootfs.tar"
        _run(_envoy_argv(binary, rootfs), "mmdebstrap of the Envoy image", timeout=1800)
        made_by = " ".join(_envoy_argv(Path("envoy"), Path("rootfs.tar")))
        write_oci_archive(
            archive,
            ENVOY_IMAGE,
            rootfs,
            user=ENVOY_USER,
            env=_ENVOY_ENV,
            created_by=made_by,
            Entrypoint=[_ENVOY_ENTRYPOINT],
        )

    return _cached("envoy", envoy_key(binary), build, log)


class ImageBuildError(RigError):
    """A step of an image build failed; the message ends with its output."""


def _run(argv: list[str], what: str, timeout: float = 300) -> None:
    if shutil.which(argv[0]) is None:
        raise ImageBuildError(f"{argv[0]} not found for {what}: run `make packages` (tools/node/debian-packages.txt)")
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
    )
    if result.returncode != 0:
        raise ImageBuildError(f"{what} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-4000:]}")

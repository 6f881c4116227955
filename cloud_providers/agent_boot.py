"""What every real cloud's boot document shares: the operator's settings for installing and starting
the worker agent, and the agent config as one JSON document.

The agent is installed **pinned** to the controller's own spotrain version, from a source the operator
chooses (``AgentInstall``; ``spotrain controller start --agent-install``), never as a bare name:

- ``served`` (the default; issue 21, finding 14): the controller's own spotrain, as a wheel it makes
  from what it runs (``autoscaler/remote/wheel.py``) and serves on the agents' HTTPS listener
  (``GET /v1/agent/wheel/<file>``); the agent config names the file and its sha256
  (``agent_wheel``, ``agent_wheel_sha256``). The boot fetches it with Python's standard library over
  TLS pinned to the controller's certificate (``FETCH_WHEEL``), refuses it unless its sha256 is the
  config's, and pip installs exactly that file, the hash in its ``#sha256=`` fragment checked by pip
  too (``PIP_WHEEL``). Nothing of spotrain itself comes from a package index;
- ``index:URL`` (``index:https://pypi.org/simple`` for the public one): ``pip install --index-url URL
  'spotrain[aws]==VERSION'``; point it at a private index (or a mirror you control) to keep the public one
  out of the instances' boot;
- ``wheel:URI[#sha256=HEX]``: a wheel you built (``pip wheel --no-deps .``) and put in a store, ``s3://``,
  ``gs://`` or ``https://``; its file name must be ``spotrain-VERSION-*.whl``, it is downloaded (``aws s3
  cp``, ``gcloud storage cp`` or ``curl``) and, given ``#sha256=``, checked before pip installs it;
- ``image``: spotrain is already on the machine image; the boot only checks that the version there is
  VERSION.

Whatever the source, the agent itself refuses to run under another version than the one its config
names (``agent_version``).

``aws/userdata.py`` (cloud-init user data) and ``gcp/userdata.py`` (a startup script and a metadata
key) differ in how they carry these to the instance, not in what they carry, so the settings, their
check and the config's serialisation live here once. The job's strings never enter these settings:
they are operator settings, each one line, and the job travels only inside the JSON document.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

AGENT_MODULE = "cloud_providers.remote.agent"
UNIT_NAME = "spotrain-agent"
DEFAULT_INDEX_URL = "https://pypi.org/simple"
INSTALL_KINDS = ("served", "index", "wheel", "image")
# Where the user data writes the agent config on every cloud (``aws/userdata.py``, ``gcp/userdata.py``).
CONFIG_PATH = "/etc/spotrain/agent.json"
# Where the controller serves its wheel (``autoscaler/remote/listener.py``), one file name after it.
WHEEL_PATH = "/v1/agent/wheel/"
# Where a downloaded wheel is kept on the instance (root-only, beside the agent's state).
WHEEL_DIR = "/var/lib/spotrain/wheel"
_PACKAGE = re.compile(r"^spotrain(\[[a-z0-9_,-]+\])?$")
_VERSION = re.compile(r"^[0-9A-Za-z.+!-]+$")
# Fixed programs run with ``python -c`` (arguments after them, never spliced in).
IMAGE_CHECK = ("import importlib.metadata as m, sys; v = m.version('spotrain'); "
               "sys.exit(0 if v == sys.argv[1] else 'spotrain ' + v + ' is on the image, the controller runs ' + sys.argv[1])")
HASH_CHECK = ("import hashlib, sys; h = hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest(); "
              "sys.exit(0 if h == sys.argv[2] else sys.argv[1] + ': sha256 ' + h + ', expected ' + sys.argv[2])")
# ``served``: the wheel the config names, read from the controller over TLS pinned to its certificate,
# kept (in WHEEL_DIR, argv[2]) only if its sha256 is the config's. Arguments: config path, wheel dir.
_WHEEL_NAME = r"spotrain-[A-Za-z0-9_.+!]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl"
_SERVED_CONFIG = f"""import hashlib, json, os, re, ssl, sys, time, urllib.request
c = json.load(open(sys.argv[1]))
n, h = c.get('agent_wheel') or '', c.get('agent_wheel_sha256') or ''
if not re.fullmatch(r'{_WHEEL_NAME}', n) or not re.fullmatch('[0-9a-f]{{64}}', h):
    sys.exit('spotrain boot: the agent config names no served wheel (agent_wheel, agent_wheel_sha256)')
p = os.path.join(sys.argv[2], n)
"""
FETCH_WHEEL = _SERVED_CONFIG + f"""x = ssl.create_default_context(cadata=c['controller_cert_pem'])
x.check_hostname = False
u = c['controller_url'].rstrip('/') + '{WHEEL_PATH}' + n
for i in range(10):
    try:
        d = urllib.request.urlopen(u, context=x, timeout=60).read()
        break
    except OSError as e:
        err = e
        time.sleep(3)
else:
    sys.exit('spotrain boot: cannot fetch ' + u + ': ' + str(err))
g = hashlib.sha256(d).hexdigest()
if g != h:
    sys.exit('spotrain boot: ' + n + ' from ' + u + ' has sha256 ' + g + ', the config says ' + h + ': refused')
t = p + '.tmp'
with open(t, 'wb') as f:
    f.write(d)
os.replace(t, p)
"""
# ``served``: pip installs exactly the fetched file, its hash checked again (by us, then by pip).
# Arguments: config path, wheel dir, the requirement's name and extras (``spotrain[aws]``).
PIP_WHEEL = _SERVED_CONFIG + """import subprocess
g = hashlib.sha256(open(p, 'rb').read()).hexdigest()
if g != h:
    sys.exit('spotrain boot: ' + p + ' has sha256 ' + g + ', the config says ' + h + ': refused')
sys.exit(subprocess.call([sys.executable, '-m', 'pip', 'install', '--quiet', sys.argv[3] + ' @ file://' + p + '#sha256=' + h]))
"""


def installed_version() -> str:
    """This installation's spotrain version (what the agents are pinned to)."""
    try:
        return importlib.metadata.version("spotrain")
    except importlib.metadata.PackageNotFoundError:
        raise ValueError("cannot pin the agent's version: spotrain is not installed here (pip install -e .)") from None


@dataclasses.dataclass(frozen=True)
class AgentInstall:
    """Where instances install the agent from, and the version they are pinned to (see the module doc)."""

    kind: str = "served"
    location: str = ""
    version: str | None = None  # None: this installation's

    def __post_init__(self) -> None:
        if self.kind not in INSTALL_KINDS:
            raise ValueError(f"agent install: {self.kind!r} is not one of {', '.join(INSTALL_KINDS)}")
        if any(c in self.location for c in "\n\r\0") or (self.version is not None and not _VERSION.match(self.version)):
            raise ValueError("agent install: the location and version must be single lines")
        if self.kind == "index" and urlparse(self.location).scheme not in ("https", "http", "file"):
            raise ValueError(f"agent install: index {self.location!r} is not an http(s):// or file:// URL")
        if self.kind == "wheel":
            self.wheel()

    @classmethod
    def parse(cls, text: str | None, *, version: str | None = None) -> AgentInstall:
        """``served``, ``index:URL``, ``wheel:URI[#sha256=HEX]`` or ``image`` (None or empty: served)."""
        if not text:
            return cls(version=version)
        kind, _, location = text.partition(":")
        if kind in ("image", "served") and not location:
            return cls(kind, "", version)
        if kind not in ("index", "wheel") or not location:
            raise ValueError(f"--agent-install: {text!r} is not served, index:URL, wheel:URI or image")
        return cls(kind, location, version)

    def pinned_version(self) -> str:
        return self.version or installed_version()

    def wheel(self) -> tuple[str, str, str | None]:
        """(URI, file name, sha256 or None) of a ``wheel:`` source; ValueError unless it is this version's."""
        uri, _, fragment = self.location.partition("#")
        name = urlparse(uri).path.rsplit("/", 1)[-1]
        if urlparse(uri).scheme not in ("s3", "gs", "https"):
            raise ValueError(f"agent install: wheel {uri!r} is not an s3://, gs:// or https:// URI")
        sha = fragment[len("sha256="):] if fragment.startswith("sha256=") else None
        if fragment and (sha is None or not re.fullmatch(r"[0-9a-f]{64}", sha)):
            raise ValueError(f"agent install: {fragment!r} is not #sha256=<64 hex digits>")
        version = self.pinned_version()
        if not name.startswith(f"spotrain-{version}-") or not name.endswith(".whl"):
            raise ValueError(f"agent install: wheel {name!r} is not spotrain {version}'s (spotrain-{version}-*.whl)")
        return uri, name, sha

    def commands(self, python: str, package: str) -> list[list[str]]:
        """The argv lists that install (or check) the pinned agent; they name no job data."""
        version = self.pinned_version()
        if self.kind == "served":
            # The file name (so the version) and its hash come in the agent config, from the controller.
            return [["install", "-d", "-m", "0700", WHEEL_DIR], [python, "-c", FETCH_WHEEL, CONFIG_PATH, WHEEL_DIR],
                    [python, "-c", PIP_WHEEL, CONFIG_PATH, WHEEL_DIR, package]]
        if self.kind == "image":
            return [[python, "-c", IMAGE_CHECK, version]]
        if self.kind == "index":
            return [[python, "-m", "pip", "install", "--quiet", "--index-url", self.location, f"{package}=={version}"]]
        uri, name, sha = self.wheel()
        local = f"{WHEEL_DIR}/{name}"
        scheme = urlparse(uri).scheme
        fetch = {"s3": ["aws", "s3", "cp", "--only-show-errors", uri, local],
                 "gs": ["gcloud", "storage", "cp", uri, local],
                 "https": ["curl", "-fsSL", "--retry", "5", "-o", local, uri]}[scheme]
        extras = package[len("spotrain"):]
        return [["install", "-d", "-m", "0700", WHEEL_DIR], fetch,
                *([[python, "-c", HASH_CHECK, local, sha]] if sha else []),
                [python, "-m", "pip", "install", "--quiet", f"spotrain{extras} @ file://{local}"]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentBootSettings:
    """How an instance installs and starts the agent. Operator settings, not job data. Each cloud's
    ``AgentBoot`` subclasses this with its image's interpreter and the package extra its store needs."""

    python: str
    # The requirement's name and extras, e.g. ``spotrain[aws]``: never a version (``install`` pins it).
    package: str
    agent_module: str = AGENT_MODULE
    unit_name: str = UNIT_NAME
    install: AgentInstall = dataclasses.field(default_factory=AgentInstall)

    def __post_init__(self) -> None:
        for field in ("python", "package", "agent_module", "unit_name"):
            value = getattr(self, field)
            if not value or any(c in value for c in "\n\r\0"):
                raise ValueError(f"agent boot setting {field}={value!r} must be a non-empty single line")
        if not _PACKAGE.match(self.package):
            raise ValueError(f"agent boot setting package={self.package!r} must be spotrain or spotrain[extras], "
                             "without a version (the install source pins it)")

    def install_commands(self) -> list[list[str]]:
        """The pinned install (or image check) of the agent, as argv lists."""
        return self.install.commands(self.python, self.package)


def config_json(config: Mapping[str, Any]) -> str:
    """The agent config as one canonical JSON document (ValueError if it is not JSON-serialisable)."""
    try:
        return json.dumps(dict(config), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"agent config is not JSON-serialisable: {exc}") from exc


__all__ = ["AGENT_MODULE", "CONFIG_PATH", "DEFAULT_INDEX_URL", "FETCH_WHEEL", "PIP_WHEEL", "UNIT_NAME", "WHEEL_PATH",
           "AgentBootSettings", "AgentInstall", "config_json",
           "installed_version"]

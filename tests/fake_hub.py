"""A local stand-in for the Hugging Face Hub's upload API, for push tests.

What `HfApi.create_repo` and `HfApi.upload_folder` send (huggingface_hub 1.x
with Xet switched off, HF_HUB_DISABLE_XET), answered as huggingface.co does:

  POST /api/repos/create                      records the JSON body; 409 if it exists
  POST /api/validate-yaml                     accepts any README metadata
  POST /api/models/{repo}/preupload/{rev}     "lfs" for weights (and files over 10 MB)
  POST /{repo}.git/info/lfs/objects/batch     "basic" transfer, hrefs back to /lfs/{oid}
  PUT  /lfs/{oid}                             the storage URL: keeps the bytes if sha256 == oid
  POST /api/models/{repo}/commit/{rev}        NDJSON: "file" (base64) and "lfsFile" (by oid)
  GET  /api/agent-harnesses                   404: huggingface_hub's best-effort telemetry,
                                              fetched once a process, cached nowhere on a 404

Every request but the storage PUT (a presigned URL on the real Hub) and the
telemetry must carry `Bearer <token>`, else 401 as for a bad token, whatever
the path. Not emulated: Xet (with hf_xet installed, the client's default: a
binary CAS protocol of its own), repo info and listings, downloads, deletions,
copies, branches, pull requests, multipart LFS, history. Anything else is
answered 404, a handler that fails 500, and both are listed in `unexpected`.
"""

import base64
import hashlib
import http.server
import json
import re
import threading

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".model")  # in the Hub's default .gitattributes
LFS_MIN_BYTES = 10 * 1024 * 1024  # larger files go to LFS whatever their name
_REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"


class FakeHub:
  """`with FakeHub(token) as hub:` serves on `hub.url` until the block ends.

  hub.repos       {repo_id: {path: bytes}}: each repo's files after its last commit
  hub.created     the JSON body of each repo creation request
  hub.log         (method, path, Authorization header or None) of every request
  hub.unexpected  "METHOD path" of each request no route answered (404), or
                  "METHOD path: error" where a route's handler failed (500)
  """

  def __init__(self, token: str):
    self.token = token
    self.repos: dict[str, dict[str, bytes]] = {}
    self.created: list[dict] = []
    self.log: list[tuple[str, str, str | None]] = []
    self.unexpected: list[str] = []
    self._lfs: dict[str, bytes] = {}  # oid -> bytes, uploaded but maybe not committed
    self._routes = [
        ("POST", r"/api/repos/create", self._create),
        ("POST", r"/api/validate-yaml", lambda body: (200, {"errors": [], "warnings": []})),
        ("POST", rf"/api/models/{_REPO}/preupload/(?P<rev>[^/]+)", self._preupload),
        ("POST", rf"/{_REPO}\.git/info/lfs/objects/batch", self._lfs_batch),
        ("PUT", r"/lfs/(?P<oid>[0-9a-f]{64})", self._lfs_put),
        ("POST", rf"/api/models/{_REPO}/commit/(?P<rev>[^/]+)", self._commit),
        ("GET", r"/api/agent-harnesses", lambda body: (404, {"error": "not on this hub"})),
    ]
    self._public = ("/lfs/", "/api/agent-harnesses")
    hub = self

    class Handler(http.server.BaseHTTPRequestHandler):
      do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = lambda request: hub._handle(request)
      log_message = lambda *args: None  # the test reads hub.log, not stderr

    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

  def __enter__(self):
    threading.Thread(target=self._server.serve_forever, daemon=True).start()
    return self

  def __exit__(self, *exc):
    self._server.shutdown()
    self._server.server_close()

  def _handle(self, request):
    path, auth = request.path.split("?")[0], request.headers.get("Authorization")
    self.log.append((request.command, path, auth))
    body = request.rfile.read(int(request.headers.get("Content-Length") or 0))  # never chunked here
    headers = {}
    if not path.startswith(self._public) and auth != f"Bearer {self.token}":
      headers["X-Error-Message"] = "Invalid credentials in Authorization header"  # huggingface.co's words
      status, answer = 401, {"error": headers["X-Error-Message"]}
    else:
      status, answer = self._answer(request.command, path, body)
    data = json.dumps(answer).encode()
    request.send_response(status)
    for key, value in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
      request.send_header(key, value)
    request.end_headers()
    request.wfile.write(data)

  def _answer(self, method, path, body):
    for verb, pattern, handler in self._routes:
      if verb == method and (m := re.fullmatch(pattern, path)):
        try:
          return handler(body, **m.groupdict())
        except Exception as e:  # pylint: disable=broad-exception-caught
          self.unexpected.append(f"{method} {path}: {type(e).__name__}: {e}")
          return 500, {"error": f"fake hub: {type(e).__name__}: {e}"}
    self.unexpected.append(f"{method} {path}")
    return 404, {"error": f"fake hub: no route for {method} {path}"}

  def _create(self, body):
    spec = json.loads(body)
    self.created.append(spec)
    repo_id = f"{spec['organization']}/{spec['name']}"
    if repo_id in self.repos:
      return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
    self.repos[repo_id] = {}
    return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}

  def _preupload(self, body, repo, rev):
    if repo not in self.repos:
      return 404, {"error": f"Repository not found: {repo}"}
    files = json.loads(body)["files"]
    lfs = lambda f: f["path"].endswith(LFS_SUFFIXES) or f["size"] >= LFS_MIN_BYTES
    return 200, {"files": [{"path": f["path"], "uploadMode": "lfs" if lfs(f) else "regular",
                            "shouldIgnore": False, "oid": None} for f in files]}

  def _lfs_batch(self, body, repo):
    spec = json.loads(body)
    assert spec["operation"] == "upload" and "basic" in spec["transfers"], spec
    return 200, {"transfer": "basic", "objects": [
        {"oid": o["oid"], "size": o["size"], "authenticated": True,
         "actions": {"upload": {"href": f"{self.url}/lfs/{o['oid']}"}}}
        for o in spec["objects"]]}

  def _lfs_put(self, body, oid):
    if hashlib.sha256(body).hexdigest() != oid:
      return 400, {"error": f"sha256 of the {len(body)} bytes is not {oid}"}
    self._lfs[oid] = body
    return 200, {}

  def _commit(self, body, repo, rev):
    if repo not in self.repos:
      return 404, {"error": f"Repository not found: {repo}"}
    files = {}
    for line in body.decode().splitlines():
      entry = json.loads(line)
      value = entry["value"]
      if entry["key"] == "file":  # base64 content inline
        files[value["path"]] = base64.b64decode(value["content"])
      elif entry["key"] == "lfsFile":
        files[value["path"]] = self._lfs[value["oid"]]  # KeyError (500): never uploaded
      elif entry["key"] != "header":
        raise ValueError(f"commit entry {entry['key']!r} is not emulated")
    self.repos[repo].update(files)
    oid = hashlib.sha1(body).hexdigest()
    return 200, {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid,
                 "success": True, "pullRequestUrl": None}


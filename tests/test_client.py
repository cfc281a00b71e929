"""jaxformer.client: what the client decides alone (the tests against a real server are in
test_serving.py)."""

import http.server
import subprocess
import sys
import threading

import pytest

from jaxformer import client, serving


def test_the_client_imports_no_jax_and_the_servers_module_keeps_its_names():
  code = ('import sys, jaxformer.client; '
          "print(sorted(m for m in ('jax', 'numpy', 'flax') if m in sys.modules))")
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=60, check=True)
  assert result.stdout.strip() == '[]'
  assert serving.translate is client.translate and serving.ServerError is client.ServerError


def test_another_kind_of_server_is_said_to_be_one():
  class Page(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # pylint: disable=invalid-name
      self.send_response(200)
      self.end_headers()
      self.wfile.write(b'<html>a web page</html>')

    def log_message(self, *args):
      pass
  with http.server.HTTPServer(('127.0.0.1', 0), Page) as other:
    threading.Thread(target=other.serve_forever, daemon=True).start()  # (the probe, the POST)
    url = f'http://127.0.0.1:{other.server_address[1]}'
    with pytest.raises(client.ServerError, match=r'answered, but not as `jaxformer serve` '
                       r'does: is it one\?$'):
      client.translate(url, ['a'], timeout=30)
    other.shutdown()


def test_the_client_refuses_the_servers_settings(capsys):
  with pytest.raises(SystemExit) as exit_info:
    client.client_main(['--server', 'http://127.0.0.1:9', '--beam', '5', '--model', 'm'])
  assert exit_info.value.code == 2
  assert ("the model and its search are the server's (set them on `jaxformer serve`): drop "
          '--beam 5 --model m.') in capsys.readouterr().err

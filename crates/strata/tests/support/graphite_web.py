"""Debian's graphite-web 1.1.8, in process, for tests/graphite_web.rs.

Serves requests through Django's test client (no web server needed) and prints the answers as
JSON: [[status, content type, body text], ...]. Reads a JSON list of [path, {param: value}]
(a GET) or [path, {param: value}, body text] (a POST of a JSON body) from stdin. Environment: GW_DIR (a scratch directory), and either GW_CLUSTER (host:port of a
cluster server, here Strata) or GW_WHISPER (a whisper directory, here carbon-cache's) with
GW_CARBONLINK (carbon-cache's cache query port, for points not yet written). With GW_SERVE (a
port), serves HTTP on 127.0.0.1 instead, one request at a time, until killed (benches/carbon_compare.rs).
"""
import json
import os
import sys
from urllib.parse import urlencode

scratch = os.environ['GW_DIR']
os.makedirs(scratch + '/log', exist_ok=True)
with open(scratch + '/strata_gw_settings.py', 'w') as f:
    f.write('SECRET_KEY = "strata-test"\n')
    f.write('STORAGE_DIR = %r\nLOG_DIR = %r\nINDEX_FILE = %r\n' % (scratch, scratch + '/log', scratch + '/index'))
    f.write('LOG_ROTATION = False\nDEFAULT_XFILES_FACTOR = 0\nTIME_ZONE = "UTC"\n')
    f.write('DATABASES = {"default": {"NAME": %r, "ENGINE": "django.db.backends.sqlite3"}}\n' % (scratch + '/graphite.db'))
    if os.environ.get('GW_CLUSTER'):
        f.write('CLUSTER_SERVERS = [%r]\nSTANDARD_DIRS = []\nWHISPER_DIR = %r\n' % (os.environ['GW_CLUSTER'], scratch + '/none'))
    else:
        whisper = os.environ['GW_WHISPER']
        f.write('WHISPER_DIR = %r\nSTANDARD_DIRS = [%r]\n' % (whisper, whisper))
        f.write('CARBONLINK_HOSTS = [%r]\n' % os.environ['GW_CARBONLINK'])
sys.path.insert(0, scratch)
os.environ['GRAPHITE_SETTINGS_MODULE'] = 'strata_gw_settings'
os.environ['DJANGO_SETTINGS_MODULE'] = 'graphite.settings'

import django  # noqa: E402
django.setup()
from django.core.management import call_command  # noqa: E402
call_command('migrate', verbosity=0, interactive=False)

if os.environ.get('GW_SERVE'):
    from wsgiref.simple_server import WSGIRequestHandler, make_server
    from django.core.wsgi import get_wsgi_application

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    make_server('127.0.0.1', int(os.environ['GW_SERVE']), get_wsgi_application(), handler_class=Quiet).serve_forever()

from django.test import Client  # noqa: E402

# An exception in graphite-web answers 500 with its text, as its server would answer.
client = Client(raise_request_exception=False)
out = []
for request in json.load(sys.stdin):
    path, params = request[0], request[1]
    if len(request) > 2:
        r = client.post(path + '?' + urlencode(params), data=request[2], content_type='application/json')
    else:
        r = client.get(path, params)
    if r.status_code == 500 and getattr(r, 'exc_info', None):
        body = '%s: %s' % (r.exc_info[0].__name__, r.exc_info[1])
    else:
        body = r.content.decode('utf-8', 'replace')
    out.append([r.status_code, r.get('Content-Type', ''), body])
print(json.dumps(out))

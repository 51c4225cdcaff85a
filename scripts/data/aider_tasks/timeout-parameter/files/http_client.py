import json
import urllib.error
import urllib.request

USER_AGENT = "inventory-sync/1.2"


def fetch(url, headers=None):
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
    with urllib.request.urlopen(request) as response:
        return response.read()


def fetch_json(url, headers=None):
    body = fetch(url, {"Accept": "application/json", **(headers or {})})
    return json.loads(body)


def fetch_all(urls, headers=None):
    results = {}
    errors = {}
    for url in urls:
        try:
            results[url] = fetch_json(url, headers)
        except urllib.error.URLError as error:
            errors[url] = str(error.reason)
        except json.JSONDecodeError as error:
            errors[url] = f"not JSON: {error}"
    return results, errors


def post_json(url, payload, headers=None):
    data = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"User-Agent": USER_AGENT, "Content-Type": "application/json",
                                              **(headers or {})})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read() or b"null")

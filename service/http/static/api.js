// The sidecar's API as the page calls it: where it is, the token, and problems.
//
// The token is never put into a URL: it goes in the Authorization header of every /v1
// call (Server-Sent Events are read with fetch for this reason; EventSource cannot send
// a header). It is kept in sessionStorage: for this tab, not across tabs or restarts.

const TOKEN_KEY = "thinktrans.token";

// The page is at <prefix>/viewer; the API at <prefix>/v1 (a proxy may add a prefix).
export const base = location.pathname.replace(/\/viewer\/?$/, "");

let token = sessionStorage.getItem(TOKEN_KEY);
let asker = null; // (message) => Promise<token>: the page's way of asking the reader
let asking = null; // one question at a time, whatever the number of refused calls

// Fragment parameters, `&`-separated like a query: #stream=<id>&token=<t>.
export function fragment() {
  const out = new Map();
  for (const part of location.hash.replace(/^#/, "").split("&")) {
    if (!part) continue;
    const eq = part.indexOf("=");
    const key = eq < 0 ? part : part.slice(0, eq);
    const value = eq < 0 ? "" : part.slice(eq + 1);
    try {
      // Percent-decoding only: a fragment is not a form, "+" is a "+" (base64 tokens).
      out.set(decodeURIComponent(key), decodeURIComponent(value));
    } catch {
      // a malformed escape: that parameter is ignored
    }
  }
  return out;
}

export function fragmentWith(params) {
  const parts = [];
  for (const [key, value] of params) {
    if (value !== null && value !== undefined && value !== "") {
      parts.push(`${encodeURIComponent(key)}=${encodeURIComponent(value)}`);
    }
  }
  return parts.length ? `#${parts.join("&")}` : "";
}

// A token given in the fragment is kept for the tab and taken out of the address bar.
export function takeTokenFromFragment() {
  const params = fragment();
  if (!params.has("token")) return;
  setToken(params.get("token"));
  params.delete("token");
  history.replaceState(null, "", location.pathname + location.search + fragmentWith(params));
}

export function setToken(value) {
  token = value || null;
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export function onTokenNeeded(ask) {
  asker = ask;
}

function askForToken(refused) {
  if (!asking) {
    asking = asker(refused ? "That token was refused; give the sidecar's token." : "")
      .then((value) => { setToken(value); })
      .finally(() => { asking = null; });
  }
  return asking;
}

// fetch on the sidecar: the token added; on 401 the reader is asked once and the call made
// again. Health routes (/readyz, /metrics) need no token and get none.
export async function api(path, init = {}) {
  for (;;) {
    const sent = token;
    const headers = new Headers(init.headers || {});
    if (sent && path.startsWith("/v1/")) headers.set("Authorization", `Bearer ${sent}`);
    const response = await fetch(base + path, {
      ...init, headers, cache: "no-store", credentials: "same-origin", referrerPolicy: "no-referrer",
    });
    if (response.status !== 401 || !asker) return response;
    if (token === sent) await askForToken(Boolean(sent));
  }
}

// A problem response's fields (RFC 9457), or what can be said of a response that is not one.
export async function problemOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON
  }
  if (body && typeof body === "object" && typeof body.detail === "string") return body;
  return { status: response.status, title: response.statusText, detail: `HTTP ${response.status}` };
}

// The node's management API as the logged-in user: HTTP basic auth on every fetch(). The
// credentials live in sessionStorage (this tab only, gone when it closes), never in a cookie:
// the browser does not attach them by itself, so another site cannot make it act as the user.

const KEY = "maxq-credentials";
const TIMEOUT_MS = 10000;

export class ApiError extends Error {
  constructor(status, body) {
    super((body && (body.reason || body.error)) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
  // Wrong or missing credentials ("not_authorized"): back to the login form. A user without the
  // tag a page needs gets 401 "not_authorised" (RabbitMQ's spelling): shown, not logged out.
  get loggedOut() {
    return this.status === 401 && (!this.body || this.body.error === "not_authorized");
  }
}

export function credentials() {
  return sessionStorage.getItem(KEY);
}

export function setCredentials(username, password) {
  // btoa takes Latin-1 only: the UTF-8 bytes of the name and password, as curl sends them
  const bytes = new TextEncoder().encode(`${username}:${password}`);
  sessionStorage.setItem(KEY, btoa(String.fromCharCode(...bytes)));
}

export function forget() {
  sessionStorage.removeItem(KEY);
}

// A path's segments, each encoded ("/" as a vhost is %2F, as RabbitMQ's API wants).
export function path(...segments) {
  return "/api/" + segments.map((s, i) => (i === 0 ? s : encodeURIComponent(s))).join("/");
}

export async function api(method, url, body = undefined, headers = {}) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
  const init = { method, headers: { Authorization: "Basic " + credentials(), ...headers }, signal: controller.signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  init.credentials = "omit"; // nothing the browser keeps by itself (cookies, a cached prompt)
  try {
    const response = await fetch(url, init);
    const text = await response.text();
    let parsed = null;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      parsed = { error: text.slice(0, 200) };
    }
    if (!response.ok) throw new ApiError(response.status, parsed);
    return parsed;
  } finally {
    clearTimeout(timer);
  }
}

export const get = (url) => api("GET", url);

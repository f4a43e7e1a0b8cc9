// The web UI's shell: login, hash routing, the page being shown, and refreshing it every 5 s.
//
// A page is { title, controls?, load, liveFirst? }: `controls` (forms, buttons) are built once when the page
// opens, so a refresh never wipes what is being typed; `load()` fetches and returns the part that
// is rebuilt at every refresh.

import { accessPage } from "./access.js";
import { credentials, forget, get, setCredentials } from "./api.js";
import { clusterPage } from "./cluster.js";
import { channelsPage, connectionsPage } from "./connections.js";
import { exchangePage, exchangesPage } from "./exchanges.js";
import { overviewPage } from "./overview.js";
import { policiesPage } from "./policies.js";
import { queuePage, queuesPage } from "./queues.js";
import { tracePage } from "./trace.js";

const REFRESH_MS = 5000;
const ROUTES = {
  overview: overviewPage,
  queues: queuesPage,
  queue: queuePage,
  exchanges: exchangesPage,
  exchange: exchangePage,
  connections: connectionsPage,
  channels: channelsPage,
  access: accessPage,
  policies: policiesPage,
  cluster: clusterPage,
  trace: tracePage,
};

const $ = (id) => document.getElementById(id);
let current = null; // { page, live, generation, loading, again }
let generation = 0; // a load answered after the page changed is dropped

const ctx = {
  notice(text, ok = true) {
    const el = $("notice");
    el.textContent = text;
    el.className = ok ? "ok" : "bad";
  },
  fail(error) {
    if (error.loggedOut) return logout("Your session ended: log in again.");
    ctx.notice(`${error.status ? `${error.status}: ` : ""}${error.message}`, false);
  },
  refresh: () => refresh(),
  navigate(hash) {
    if (location.hash === hash) route();
    else location.hash = hash;
  },
};

function parseHash() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const make = ROUTES[parts[0]];
  return make ? [parts[0], make, parts.slice(1)] : ["overview", overviewPage, []];
}

function route() {
  if (!credentials()) return showLogin();
  const [name, make, params] = parseHash();
  for (const a of $("nav").querySelectorAll("a")) a.classList.toggle("current", a.getAttribute("href") === `#/${name}` || a.getAttribute("href") === `#/${name}s`);
  const page = make(ctx, params);
  document.title = `${page.title} · MaxQ-Raft`;
  const live = document.createElement("div");
  live.id = "live";
  const controls = (page.controls || []).filter(Boolean);
  // an object's page shows its figures under its heading, before its forms
  if (page.liveFirst) $("page").replaceChildren(controls[0], live, ...controls.slice(1));
  else $("page").replaceChildren(...controls, live);
  $("notice").textContent = "";
  current = { page, live, generation: ++generation, loading: false, again: false };
  refresh();
}

async function refresh() {
  const shown = current;
  if (!shown) return;
  if (shown.loading) {
    shown.again = true; // asked during a load (after a change): load once more when it ends
    return;
  }
  const { page, live, generation: mine } = shown;
  shown.loading = true;
  try {
    const content = await page.load();
    if (mine !== generation) return;
    live.replaceChildren(content);
    $("refreshed").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    if (mine !== generation) return;
    if (error.loggedOut) return logout("Your session ended: log in again.");
    live.replaceChildren();
    ctx.fail(error);
  } finally {
    shown.loading = false;
  }
  if (shown.again && mine === generation) {
    shown.again = false;
    refresh();
  }
}

function showLogin(message = "") {
  current = null;
  $("app-view").hidden = true;
  $("login-view").hidden = false;
  $("login-error").textContent = message;
  $("login-username").focus();
}

function logout(message = "") {
  forget();
  $("page").replaceChildren();
  showLogin(message);
}

async function login(event) {
  event.preventDefault();
  setCredentials($("login-username").value, $("login-password").value);
  $("login-password").value = "";
  try {
    const me = await get("/api/whoami");
    $("whoami").textContent = `${me.name} (${me.tags.join(", ") || "no tags"})`;
    showApp();
  } catch (error) {
    forget();
    $("login-error").textContent = error.status === 401 ? `Login failed: ${error.message}` : `The node did not answer: ${error.message}`;
  }
}

function showApp() {
  $("login-view").hidden = true;
  $("app-view").hidden = false;
  route();
}

async function start() {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", () => logout());
  window.addEventListener("hashchange", route);
  setInterval(() => {
    if ($("auto-refresh").checked && !document.hidden) refresh();
  }, REFRESH_MS);
  if (!credentials()) return showLogin();
  try {
    const me = await get("/api/whoami");
    $("whoami").textContent = `${me.name} (${me.tags.join(", ")})`;
    showApp();
  } catch (error) {
    logout(error.loggedOut ? "" : error.message);
  }
}

start();

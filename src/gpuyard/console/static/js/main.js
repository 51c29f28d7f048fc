// The console's entry point: a router on location.hash, one module per page. Each
// page's render(main, params) may return a cleanup function (stops its polling,
// closes its streams) that runs when the page is left.
import { h, clear } from "./ui.js";
import { load, session, signOut } from "./session.js";
import * as signin from "./pages/signin.js";
import * as clusters from "./pages/clusters.js";
import * as create from "./pages/create.js";
import * as detail from "./pages/detail.js";
import * as keys from "./pages/keys.js";
import * as billing from "./pages/billing.js";

const ROUTES = [
  [/^#\/signin$/, signin],
  [/^#\/clusters\/new$/, create],
  [/^#\/clusters\/([A-Za-z0-9_-]+)$/, detail],
  [/^#\/keys$/, keys],
  [/^#\/billing$/, billing],
  [/^#\/clusters$/, clusters],
];

let cleanup = null;

function header() {
  const nav = document.getElementById("nav");
  const who = clear(document.getElementById("who"));
  nav.hidden = !session.info;
  if (!session.info) return;
  const email = session.me ? session.me.user.email : "";
  who.append(
    h("span", { class: "muted", "data-testid": "whoami" }, `${email} · ${session.role} · ${session.scope} key`),
    h("button", { class: "link", type: "button", "data-testid": "sign-out", onclick: onSignOut }, "Sign out"),
  );
}

async function onSignOut() {
  await signOut();
  header();
  location.hash = "#/signin";
}

async function route() {
  if (cleanup) {
    try {
      cleanup();
    } catch (err) {
      console.warn(err);
    }
    cleanup = null;
  }
  const hash = location.hash || "#/clusters";
  if (!session.info && hash !== "#/signin") {
    location.hash = "#/signin";
    return;
  }
  const main = clear(document.getElementById("view"));
  for (const [pattern, page] of ROUTES) {
    const m = hash.match(pattern);
    if (m) {
      cleanup = (await page.render(main, m.slice(1))) || null;
      header();
      return;
    }
  }
  main.append(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/clusters" }, "Back to clusters")));
}

window.addEventListener("hashchange", route);
window.addEventListener("gpuyard:signed-out", () => {
  session.info = null;
  header();
  if (location.hash !== "#/signin") location.hash = "#/signin";
});
window.addEventListener("gpuyard:signed-in", () => {
  header();
  location.hash = "#/clusters";
});

await load();
header();
route();

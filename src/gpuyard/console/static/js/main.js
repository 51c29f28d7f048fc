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
import * as secrets from "./pages/secrets.js";
import * as templates from "./pages/templates.js";
import * as endpoints from "./pages/endpoints.js";
import * as endpointDetail from "./pages/endpoint_detail.js";
import * as registryAuths from "./pages/registry_auths.js";
import * as billing from "./pages/billing.js";
import * as training from "./pages/training.js";
import * as trainingCreate from "./pages/training_create.js";
import * as trainingDetail from "./pages/training_detail.js";
import * as account from "./pages/account.js";
import * as hosts from "./pages/hosts.js";
import * as accounts from "./pages/accounts.js";

const ROUTES = [
  [/^#\/signin$/, signin],
  [/^#\/clusters\/new$/, create],
  [/^#\/clusters\/new\?template=([A-Za-z0-9_-]+)$/, { render: (main, [id]) => create.render(main, [], { templateId: id }) }],
  [/^#\/clusters\/new\/clone\/([A-Za-z0-9_-]+)$/, create],
  [/^#\/clusters\/([A-Za-z0-9_-]+)$/, detail],
  [/^#\/keys$/, keys],
  [/^#\/secrets$/, secrets],
  [/^#\/templates$/, templates],
  [/^#\/endpoints$/, endpoints],
  [/^#\/endpoints\/([a-z0-9]+)$/, endpointDetail],
  [/^#\/registry-auths$/, registryAuths],
  [/^#\/billing$/, billing],
  [/^#\/clusters$/, clusters],
  // The training pages carry their scope (project_id, location) as a query.
  [/^#\/training\/new(?:\?(.*))?$/, trainingCreate],
  [/^#\/training\/(\d+)(?:\?(.*))?$/, trainingDetail],
  [/^#\/training(?:\?(.*))?$/, training],
  [/^#\/account$/, account],
  [/^#\/hosts$/, hosts],
  [/^#\/accounts$/, accounts],
];

let cleanup = null;
const AFTER_SIGN_IN = "gpuyard.after-sign-in";

function header() {
  const nav = document.getElementById("nav");
  const who = clear(document.getElementById("who"));
  nav.hidden = !session.info;
  if (!session.info) return;
  // Links to pages the signed-in role could not use are not offered.
  for (const link of nav.querySelectorAll("[data-operator]")) link.hidden = !session.operator;
  for (const link of nav.querySelectorAll("[data-needs]")) link.hidden = !session.may(link.dataset.needs);
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
    // The page asked for is kept, and opened once signed in (a deep link survives).
    sessionStorage.setItem(AFTER_SIGN_IN, hash);
    location.hash = "#/signin";
    return;
  }
  const main = clear(document.getElementById("view"));
  for (const [pattern, page] of ROUTES) {
    const m = hash.match(pattern);
    if (m) {
      try {
        cleanup = (await page.render(main, m.slice(1))) || null;
      } catch (err) {
        // A page that cannot load says why instead of staying blank.
        main.append(h("p", { class: "field-error", role: "alert" }, `Could not load this page: ${err.message}`));
      }
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
  const wanted = sessionStorage.getItem(AFTER_SIGN_IN);
  sessionStorage.removeItem(AFTER_SIGN_IN);
  location.hash = wanted && wanted !== "#/signin" ? wanted : "#/clusters";
});

await load();
header();
route();

// The training API (seed 002) works in a scope: `project_id` and `location` on every
// request. The training pages carry the scope in their hash (#/training?project_id=1&
// location=local), so a link to one of them opens the same cluster; without one they
// start from the default project and the first location with hosts.
import { get } from "./api.js";
import { field, h } from "./ui.js";

export const BASE = "/distributed_jobs_v2/cluster/";

// The scope named by a hash query string ("project_id=1&location=local"), or null.
export function parseScope(query) {
  const q = new URLSearchParams(query || "");
  const project = q.get("project_id");
  const location = q.get("location");
  return project && location ? { project_id: project, location } : null;
}

export function scopeQuery(scope, extra = {}) {
  return new URLSearchParams({ project_id: String(scope.project_id), location: scope.location, ...extra }).toString();
}

// The training API's path for `rest` ("" for the list, "12/" for a cluster,
// "12/events/") in `scope`.
export function trainingPath(scope, rest = "", extra = {}) {
  return `${BASE}${rest}?${scopeQuery(scope, extra)}`;
}

// The projects and locations to choose from, and the scope to start in.
export async function loadScopes(wanted) {
  const [projects, locations] = await Promise.all([
    get("/v1/projects").then((a) => a.data.projects),
    get("/v1/locations").then((a) => a.data.locations),
  ]);
  let scope = wanted;
  if (!scope) {
    const project = projects.find((p) => p.is_default) || projects[0];
    const location = locations[0];
    scope = project && location ? { project_id: String(project.id), location: location.location } : null;
  }
  return { projects, locations, scope };
}

// Project and location pickers; `onChange(scope)` when either changes.
export function scopePicker({ projects, locations, scope }, onChange) {
  const project = h("select", { "aria-label": "Project", "data-testid": "training-project" },
    projects.map((p) => h("option", { value: String(p.id), selected: scope && String(p.id) === String(scope.project_id) }, p.name)));
  const location = h("select", { "aria-label": "Location", "data-testid": "training-location" },
    locations.map((l) => h("option", { value: l.location, selected: scope && l.location === scope.location },
      `${l.location} (${l.healthy_hosts}/${l.hosts} hosts healthy)`)));
  const changed = () => onChange({ project_id: project.value, location: location.value });
  project.addEventListener("change", changed);
  location.addEventListener("change", changed);
  return h("div", { class: "toolbar" }, field("Project", project), field("Location", location));
}

// Who is signed in: the console session (its key's scope) and /v1/me (the role).
// The API key itself never stays in the page: it is sent once to sign in.
import { api, del, get, setCsrfToken } from "./api.js";

const WRITE_ROLES = new Set(["owner", "admin", "member"]);
// Who may do what beyond clusters (docs/roles.md): the page offers no more.
const ROLES_FOR = {
  manage_members: ["owner", "admin"],
  read_billing: ["owner", "admin", "billing"],
  manage_budget: ["owner", "admin", "billing"],
  read_audit: ["owner", "admin"],
};

export const session = {
  info: null, // GET /v1/console/session's data
  me: null, // GET /v1/me's data
  get scope() {
    return this.info ? this.info.key.scope : null;
  },
  get role() {
    return this.me ? this.me.acting.role : null;
  },
  // Whether changes to clusters would be allowed (a read key or a viewer: no).
  get canWrite() {
    return !!this.info && this.scope !== "read" && WRITE_ROLES.has(this.role);
  },
  // A key restricted to a project: nothing of the whole account (docs/roles.md).
  get restricted() {
    return !!this.info && this.info.key.restricted_to_project != null;
  },
  // The installation's operator: only its user holds admin-scoped keys (not restricted).
  get operator() {
    return this.scope === "admin" && !this.restricted;
  },
  get accountId() {
    return this.me ? this.me.acting.account_id : null;
  },
  // Whether the role (or the operator) has `what` (a key of ROLES_FOR), for reading.
  may(what) {
    if (!this.info || this.restricted) return false;
    return this.operator || (ROLES_FOR[what] || []).includes(this.role);
  },
  // ... and for changing: a read key changes nothing.
  mayChange(what) {
    return this.may(what) && this.scope !== "read";
  },
};

export async function load() {
  try {
    session.info = (await get("/v1/console/session", { quiet: true })).data;
    session.me = (await get("/v1/me", { quiet: true })).data;
    return true;
  } catch {
    session.info = null;
    session.me = null;
    return false;
  }
}

export async function signIn(apiKey) {
  const answer = await api("POST", "/v1/console/session", { api_key: apiKey }, { quiet: true });
  setCsrfToken(answer.data.csrf_token);
  await load();
}

export async function signOut() {
  try {
    await del("/v1/console/session", { quiet: true });
  } finally {
    setCsrfToken(null);
    session.info = null;
    session.me = null;
  }
}

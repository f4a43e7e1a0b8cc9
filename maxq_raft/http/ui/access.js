// Users, vhosts and permissions (an administrator's page; others see the node's refusal).

import { api, get, path } from "./api.js";
import { field, form, h, section, table } from "./dom.js";

function action(ctx, label, confirmText, run, done) {
  return h("button", {
    type: "button",
    class: "danger",
    onclick: async () => {
      if (!window.confirm(confirmText)) return;
      try {
        await run();
        ctx.notice(done, true);
        ctx.refresh();
      } catch (error) {
        ctx.fail(error);
      }
    },
  }, label);
}

function submitter(ctx, run, done) {
  return async (values) => {
    try {
      await run(values);
      ctx.notice(done(values), true);
      ctx.refresh();
    } catch (error) {
      ctx.fail(error);
    }
  };
}

export function accessPage(ctx) {
  return {
    title: "Users and vhosts",
    controls: [
      section(
        "Add a user",
        form(
          "add-user-form",
          [field("name", "name", { required: true }), field("password", "password", { type: "password", autocomplete: "new-password" }), field("tags (comma separated)", "tags", { value: "management" })],
          "Add user",
          submitter(ctx, (v) => api("PUT", path("users", v.name), { password: v.password, tags: v.tags }), (v) => `user ${v.name} saved`),
        ),
      ),
      section(
        "Add a vhost",
        form("add-vhost-form", [field("name", "name", { required: true })], "Add vhost", submitter(ctx, (v) => api("PUT", path("vhosts", v.name)), (v) => `vhost ${v.name} added`)),
      ),
      section(
        "Set permissions",
        form(
          "set-permissions-form",
          [field("user", "user", { required: true }), field("vhost", "vhost", { value: "/" }), field("configure", "configure", { value: ".*" }), field("write", "write", { value: ".*" }), field("read", "read", { value: ".*" })],
          "Set permissions",
          submitter(ctx, (v) => api("PUT", path("permissions", v.vhost, v.user), { configure: v.configure, write: v.write, read: v.read }), (v) => `permissions of ${v.user} in ${v.vhost} set`),
        ),
      ),
    ],
    async load() {
      const [users, vhosts, permissions] = await Promise.all([get("/api/users"), get("/api/vhosts"), get("/api/permissions")]);
      return h(
        "div",
        {},
        section(
          "Users",
          table(
            [
              ["name", (u) => u.name],
              ["tags", (u) => u.tags.join(", ")],
              ["", (u) => action(ctx, "Delete", `Delete user ${u.name}?`, () => api("DELETE", path("users", u.name)), `user ${u.name} deleted`)],
            ],
            users,
          ),
        ),
        section(
          "Virtual hosts",
          table(
            [
              ["name", (v) => v.name],
              ["limits", (v) => JSON.stringify(v.limits)],
              ["", (v) => action(ctx, "Delete", `Delete vhost ${v.name} and everything in it?`, () => api("DELETE", path("vhosts", v.name)), `vhost ${v.name} deleted`)],
            ],
            vhosts,
          ),
        ),
        section(
          "Permissions",
          table(
            [
              ["user", (p) => p.user],
              ["vhost", (p) => p.vhost],
              ["configure", (p) => p.configure],
              ["write", (p) => p.write],
              ["read", (p) => p.read],
              ["", (p) => action(ctx, "Clear", `Clear the permissions of ${p.user} in ${p.vhost}?`, () => api("DELETE", path("permissions", p.vhost, p.user)), "permissions cleared")],
            ],
            permissions,
          ),
        ),
      );
    },
  };
}

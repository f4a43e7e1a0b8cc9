// Policies: the list, setting one (its definition as JSON) and clearing one.

import { api, get, path } from "./api.js";
import { field, form, h, section, table } from "./dom.js";

export function policiesPage(ctx) {
  return {
    title: "Policies",
    controls: [
      section(
        "Set a policy",
        form(
          "add-policy-form",
          [
            field("vhost", "vhost", { value: "/" }),
            field("name", "name", { required: true }),
            field("pattern", "pattern", { value: ".*" }),
            field("apply to", "apply-to", { tag: "select", options: ["all", "queues", "exchanges"] }),
            field("priority", "priority", { type: "number", value: 0 }),
            field("definition (JSON)", "definition", { tag: "textarea", placeholder: '{"max-length": 1000}' }),
          ],
          "Set policy",
          async (v) => {
            let definition;
            try {
              definition = JSON.parse(v.definition || "{}");
            } catch (error) {
              ctx.notice(`the definition is not JSON: ${error.message}`, false);
              return;
            }
            try {
              await api("PUT", path("policies", v.vhost, v.name), { pattern: v.pattern, "apply-to": v["apply-to"], priority: Number(v.priority), definition });
              ctx.notice(`policy ${v.name} set`, true);
              ctx.refresh();
            } catch (error) {
              ctx.fail(error);
            }
          },
        ),
      ),
    ],
    async load() {
      const policies = await get("/api/policies");
      const clear = (p) =>
        h("button", {
          type: "button",
          class: "danger",
          onclick: async () => {
            if (!window.confirm(`Clear policy ${p.name}?`)) return;
            try {
              await api("DELETE", path("policies", p.vhost, p.name));
              ctx.notice(`policy ${p.name} cleared`, true);
              ctx.refresh();
            } catch (error) {
              ctx.fail(error);
            }
          },
        }, "Clear");
      return section(
        "Policies",
        table(
          [
            ["vhost", (p) => p.vhost],
            ["name", (p) => p.name],
            ["pattern", (p) => p.pattern],
            ["apply to", (p) => p["apply-to"]],
            ["priority", (p) => p.priority, "num"],
            ["definition", (p) => JSON.stringify(p.definition)],
            ["", clear],
          ],
          policies,
          "no policies",
        ),
      );
    },
  };
}

// Message trace (x-trace): the records of a message, a correlation id or a queue, from
// GET /api/trace/{vhost} (docs/queue-features.md). The query is the page's hash,
// #/trace/VHOST/KIND/VALUE[/SINCE], so a trace can be linked and the 5 s refresh re-reads it.

import { get, path } from "./api.js";
import { field, form, h, section, table } from "./dom.js";

const KINDS = ["message_id", "correlation_id", "queue"];
// Shown in their own columns; everything else of a record goes in "details".
const SHOWN = new Set(["time_ms", "log_index", "n", "vhost", "queue", "event", "message_id", "body_base64"]);

function details(record) {
  return Object.entries(record)
    .filter(([key]) => !SHOWN.has(key))
    .map(([key, value]) => `${key}=${typeof value === "object" ? JSON.stringify(value) : value}`)
    .join(" ");
}

export function tracePage(ctx, params) {
  const [vhost = "/", kind = "message_id", value = "", since = ""] = params;
  return {
    title: "Trace",
    controls: [
      section(
        "Find a trace",
        form(
          "trace-form",
          [
            field("vhost", "vhost", { value: vhost }),
            field("by", "kind", { tag: "select", options: KINDS, value: KINDS.includes(kind) ? kind : "message_id" }),
            field("value", "value", { value, required: true, placeholder: "message id, correlation id or queue" }),
            field("since", "since", { value: since, placeholder: "10m, 2h, 7d (optional)" }),
          ],
          "Show",
          (v) => ctx.navigate("#/" + ["trace", v.vhost, v.kind, v.value, v.since].filter((p, i) => i < 4 || p).map(encodeURIComponent).join("/")),
        ),
      ),
    ],
    async load() {
      if (!value) return h("p", { class: "muted" }, "Queues with x-trace (argument or policy) record each message's steps.");
      const query = new URLSearchParams({ [kind]: value });
      if (since) query.set("since", since);
      const records = await get(`${path("trace", vhost)}?${query}`);
      return section(
        `Trace of ${kind.replace("_", " ")} ${value}`,
        table(
          [
            ["time", (r) => new Date(r.time_ms).toISOString()],
            ["queue", (r) => r.queue],
            ["event", (r) => r.event],
            ["message id", (r) => r.message_id ?? ""],
            ["details", details],
            ["body", (r) => (r.body_base64 ? h("code", {}, r.body_base64) : "")],
          ],
          records,
          "no trace records",
        ),
      );
    },
  };
}

// The message browser's forms: publish (to an exchange, or to a queue through the default
// exchange) and get (with the ack mode deciding whether the messages go back to the queue).

import { api, path } from "./api.js";
import { field, form, h } from "./dom.js";

const ACKMODES = ["ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false"];

export function publishForm(ctx, vhost, exchange, routingKey = "") {
  return form(
    "publish-form",
    [
      field("routing key", "routing_key", { value: routingKey }),
      field("payload", "payload", { tag: "textarea" }),
      field("persistent", "persistent", { type: "checkbox" }),
    ],
    "Publish",
    async (values) => {
      try {
        const answer = await api("POST", path("exchanges", vhost, exchange || "amq.default", "publish"), {
          properties: values.persistent ? { delivery_mode: 2 } : {},
          routing_key: values.routing_key,
          payload: values.payload,
          payload_encoding: "string",
        });
        ctx.notice(answer.routed ? "published" : "published, but routed to no queue", answer.routed);
        ctx.refresh();
      } catch (error) {
        ctx.fail(error);
      }
    },
  );
}

function shown(message, i) {
  return h(
    "div",
    { class: "message" },
    h("h3", {}, `message ${i + 1}`),
    h("p", { class: "muted" }, `exchange "${message.exchange}" · routing key "${message.routing_key}" · ${message.payload_bytes} bytes · redelivered ${message.redelivered} · ${message.message_count} left`),
    h("pre", { class: "payload" }, message.payload_encoding === "base64" ? `(base64) ${message.payload}` : message.payload),
    Object.keys(message.properties || {}).length ? h("pre", { class: "payload" }, JSON.stringify(message.properties, null, 1)) : null,
  );
}

export function getForm(ctx, vhost, queue) {
  const results = h("div", { id: "get-results" });
  const el = form(
    "get-form",
    [
      field("count", "count", { type: "number", min: 1, max: 100, value: 1 }),
      field("ack mode", "ackmode", { tag: "select", options: ACKMODES, value: "ack_requeue_true" }),
    ],
    "Get messages",
    async (values) => {
      try {
        const messages = await api("POST", path("queues", vhost, queue, "get"), {
          count: Number(values.count),
          ackmode: values.ackmode,
          encoding: "auto",
          truncate: 50000,
        });
        results.replaceChildren(...(messages.length ? messages.map(shown) : [h("p", { class: "muted" }, "the queue is empty")]));
        ctx.refresh();
      } catch (error) {
        ctx.fail(error);
      }
    },
  );
  return h("div", {}, el, results);
}

// Queues: the list (per vhost, with depth and consumers), declaring one, and a queue's page with
// its figures and bindings, the message browser (publish, get), purge and delete.

import { api, get, path } from "./api.js";
import { argumentsField, field, form, h, link, num, parseArguments, section, table } from "./dom.js";
import { listFilter } from "./filter.js";
import { getForm, publishForm } from "./messages.js";

export function queuesPage(ctx) {
  const filter = listFilter(ctx, "queues");
  return {
    title: "Queues",
    controls: [
      filter.controls,
      section(
        "Add a queue",
        form(
          "add-queue-form",
          [
            field("vhost", "vhost", { value: "/" }),
            field("name", "name", { required: true }),
            field("durable", "durable", { type: "checkbox", checked: true }),
            argumentsField('{"x-max-length": 1000}'),
          ],
          "Add queue",
          async (values) => {
            try {
              const args = parseArguments(values.arguments);
              await api("PUT", path("queues", values.vhost, values.name), { durable: values.durable, auto_delete: false, arguments: args });
              ctx.notice(`queue ${values.name} declared`, true);
              ctx.refresh();
            } catch (error) {
              ctx.fail(error);
            }
          },
        ),
      ),
    ],
    async load() {
      const queues = await filter.load();
      return section(
        "Queues",
        table(
          [
            ["vhost", (q) => q.vhost],
            ["name", (q) => link(q.name, "queue", q.vhost, q.name)],
            ["features", (q) => [q.durable && "durable", q.auto_delete && "auto-delete", q.exclusive && "exclusive"].filter(Boolean).join(" ")],
            ["messages", (q) => num(q.messages), "num"],
            ["ready", (q) => num(q.messages_ready), "num"],
            ["unacked", (q) => num(q.messages_unacknowledged), "num"],
            ["consumers", (q) => num(q.consumers), "num"],
          ],
          queues,
          "no queues",
          (q) => q.name,
        ),
      );
    },
  };
}

export function queuePage(ctx, [vhost, name]) {
  const url = path("queues", vhost, name);
  const act = (label, id, confirmText, method, target, done) =>
    h("button", {
      id,
      class: "danger",
      type: "button",
      onclick: async () => {
        if (!window.confirm(confirmText)) return;
        try {
          await api(method, target);
          ctx.notice(done, true);
          if (method === "DELETE" && target === url) ctx.navigate("#/queues");
          else ctx.refresh();
        } catch (error) {
          ctx.fail(error);
        }
      },
    }, label);
  return {
    title: `Queue ${name}`,
    liveFirst: true,
    controls: [
      h("h1", {}, "Queue ", h("span", { id: "queue-name" }, name), h("span", { class: "muted" }, ` in vhost ${vhost}`)),
      h(
        "p",
        {},
        act("Purge", "purge-queue", `Purge every ready message of queue ${name}?`, "DELETE", url + "/contents", "purged"),
        " ",
        act("Delete", "delete-queue", `Delete queue ${name} and its messages?`, "DELETE", url, `queue ${name} deleted`),
      ),
      section("Publish a message", publishForm(ctx, vhost, "", name)),
      section("Get messages", getForm(ctx, vhost, name)),
    ],
    async load() {
      const [q, bindings] = await Promise.all([get(url), get(url + "/bindings")]);
      return h(
        "div",
        {},
        section(
          "Figures",
          table(
            [
              ["messages", (r) => num(r.messages), "num"],
              ["ready", (r) => num(r.messages_ready), "num"],
              ["unacked", (r) => num(r.messages_unacknowledged), "num"],
              ["consumers", (r) => num(r.consumers), "num"],
              ["durable", (r) => String(r.durable)],
              ["node", (r) => r.node],
              ["arguments", (r) => JSON.stringify(r.arguments)],
            ],
            [q],
          ),
        ),
        section(
          "Bindings",
          table([["from exchange", (b) => (b.source ? link(b.source, "exchange", vhost, b.source) : "(default)")], ["routing key", (b) => b.routing_key], ["arguments", (b) => JSON.stringify(b.arguments)]], bindings),
        ),
      );
    },
  };
}

// Exchanges: the list, declaring one, and an exchange's page with its bindings (add, remove) and a
// publish form.

import { api, get, path } from "./api.js";
import { argumentsField, field, form, h, link, parseArguments, section, table } from "./dom.js";
import { listFilter } from "./filter.js";
import { publishForm } from "./messages.js";

// (the last two: the plugins' types, rabbitmq-delayed-message-exchange and rabbitmq-message-deduplication)
const TYPES = ["direct", "fanout", "topic", "headers", "x-delayed-message", "x-message-deduplication"];

function shownName(name) {
  return name === "" ? "(AMQP default)" : name;
}

export function exchangesPage(ctx) {
  const filter = listFilter(ctx, "exchanges");
  return {
    title: "Exchanges",
    controls: [
      filter.controls,
      section(
        "Add an exchange",
        form(
          "add-exchange-form",
          [
            field("vhost", "vhost", { value: "/" }),
            field("name", "name", { required: true }),
            field("type", "type", { tag: "select", options: TYPES }),
            field("durable", "durable", { type: "checkbox", checked: true }),
            argumentsField('{"x-cache-size": 1000}'),
          ],
          "Add exchange",
          async (values) => {
            try {
              const args = parseArguments(values.arguments);
              await api("PUT", path("exchanges", values.vhost, values.name), { type: values.type, durable: values.durable, auto_delete: false, internal: false, arguments: args });
              ctx.notice(`exchange ${values.name} declared`, true);
              ctx.refresh();
            } catch (error) {
              ctx.fail(error);
            }
          },
        ),
      ),
    ],
    async load() {
      const exchanges = await filter.load();
      return section(
        "Exchanges",
        table(
          [
            ["vhost", (x) => x.vhost],
            ["name", (x) => link(shownName(x.name), "exchange", x.vhost, x.name || "amq.default")],
            ["type", (x) => x.type],
            ["features", (x) => [x.durable && "durable", x.auto_delete && "auto-delete", x.internal && "internal"].filter(Boolean).join(" ")],
          ],
          exchanges,
        ),
      );
    },
  };
}

export function exchangePage(ctx, [vhost, name]) {
  const url = path("exchanges", vhost, name);
  const builtIn = name === "amq.default" || name.startsWith("amq.");
  return {
    title: `Exchange ${name}`,
    liveFirst: true,
    controls: [
      h("h1", {}, `Exchange ${name}`, h("span", { class: "muted" }, ` in vhost ${vhost}`)),
      builtIn
        ? null
        : h("p", {}, h("button", {
            class: "danger",
            type: "button",
            id: "delete-exchange",
            onclick: async () => {
              if (!window.confirm(`Delete exchange ${name}?`)) return;
              try {
                await api("DELETE", url);
                ctx.notice(`exchange ${name} deleted`, true);
                ctx.navigate("#/exchanges");
              } catch (error) {
                ctx.fail(error);
              }
            },
          }, "Delete")),
      name === "amq.default"
        ? null
        : section(
            "Add a binding",
            form(
              "add-binding-form",
              [field("to", "kind", { tag: "select", options: ["queue", "exchange"] }), field("destination", "destination", { required: true }), field("routing key", "routing_key")],
              "Bind",
              async (values) => {
                try {
                  await api("POST", path("bindings", vhost, "e", name, values.kind === "queue" ? "q" : "e", values.destination), { routing_key: values.routing_key, arguments: {} });
                  ctx.notice("bound", true);
                  ctx.refresh();
                } catch (error) {
                  ctx.fail(error);
                }
              },
            ),
          ),
      section("Publish a message", publishForm(ctx, vhost, name)),
    ],
    async load() {
      const [x, bindings] = await Promise.all([get(url), get(url + "/bindings/source")]);
      const unbind = (b) =>
        h("button", {
          type: "button",
          class: "danger",
          onclick: async () => {
            try {
              await api("DELETE", path("bindings", vhost, "e", name, b.destination_type === "queue" ? "q" : "e", b.destination, b.properties_key));
              ctx.notice("unbound", true);
              ctx.refresh();
            } catch (error) {
              ctx.fail(error);
            }
          },
        }, "Unbind");
      return h(
        "div",
        {},
        section("Exchange", table([["type", (r) => r.type], ["durable", (r) => String(r.durable)], ["internal", (r) => String(r.internal)], ["arguments", (r) => JSON.stringify(r.arguments)]], [x])),
        section(
          "Bindings from this exchange",
          table(
            [
              ["to", (b) => (b.destination_type === "queue" ? link(b.destination, "queue", vhost, b.destination) : link(b.destination, "exchange", vhost, b.destination))],
              ["kind", (b) => b.destination_type],
              ["routing key", (b) => b.routing_key],
              ["arguments", (b) => JSON.stringify(b.arguments)],
              ["", unbind],
            ],
            bindings,
          ),
        ),
      );
    },
  };
}

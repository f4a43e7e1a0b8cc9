// Connections (close one, with a reason the client is told: DELETE with X-Reason, as RabbitMQ's
// API) and channels.

import { api, get, path } from "./api.js";
import { field, h, num, section, table } from "./dom.js";

export function connectionsPage(ctx) {
  const reason = field("reason given to the client when closing", "reason", { id: "close-reason", value: "Closed via the web UI" });
  const close = (c) =>
    h("button", {
      type: "button",
      class: "danger close-connection",
      "data-name": c.name,
      onclick: async () => {
        if (!window.confirm(`Close connection ${c.name} from ${c.peer_host}?`)) return;
        try {
          const text = reason.querySelector("input").value;
          // a header carries Latin-1 only: anything else is left to the node's default reason
          const headers = /^[\x20-\x7e]*$/.test(text) && text ? { "X-Reason": text } : {};
          await api("DELETE", path("connections", c.name), undefined, headers);
          ctx.notice(`connection ${c.name} closed`, true);
          ctx.refresh();
        } catch (error) {
          ctx.fail(error);
        }
      },
    }, "Close");
  return {
    title: "Connections",
    controls: [reason],
    async load() {
      const connections = await get("/api/connections?sort=name");
      return section(
        "Connections",
        table(
          [
            ["name", (c) => c.name],
            ["node", (c) => c.node],
            ["user", (c) => c.user],
            ["vhost", (c) => c.vhost],
            ["from", (c) => c.peer_host],
            ["client", (c) => String(c.client || "")],
            ["channels", (c) => num(c.channels), "num"],
            ["messages in", (c) => num(c.messages_in), "num"],
            ["messages out", (c) => num(c.messages_out), "num"],
            ["", close],
          ],
          connections,
          "no connections",
        ),
      );
    },
  };
}

export function channelsPage() {
  return {
    title: "Channels",
    async load() {
      const channels = await get("/api/channels");
      return section(
        "Channels",
        table(
          [
            ["channel", (c) => c.name],
            ["user", (c) => c.user],
            ["vhost", (c) => c.vhost],
            ["mode", (c) => [c.confirm && "confirm", c.transactional && "transactional"].filter(Boolean).join(" ")],
            ["prefetch", (c) => num(c.prefetch_count), "num"],
            ["consumers", (c) => num(c.consumer_count), "num"],
            ["unacked", (c) => num(c.messages_unacknowledged), "num"],
            ["unconfirmed", (c) => num(c.messages_unconfirmed), "num"],
          ],
          channels,
          "no channels",
        ),
      );
    },
  };
}

from collections import defaultdict


class Inventory:
    def __init__(self):
        self.items = {}
        self.history = []

    def add(self, name, quantity, price):
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        current = self.items.get(name, {"quantity": 0, "price": price})
        current["quantity"] += quantity
        current["price"] = price
        self.items[name] = current
        self.history.append(("add", name, quantity))

    def remove(self, name, quantity):
        if name not in self.items:
            raise KeyError(name)
        if self.items[name]["quantity"] < quantity:
            raise ValueError(f"only {self.items[name]['quantity']} {name} left")
        self.items[name]["quantity"] -= quantity
        self.history.append(("remove", name, quantity))
        if self.items[name]["quantity"] == 0:
            del self.items[name]

    def value(self):
        return sum(item["quantity"] * item["price"] for item in self.items.values())

    def count(self, name):
        return self.items.get(name, {"quantity": 0})["quantity"]

    def movements(self):
        totals = defaultdict(int)
        for action, name, quantity in self.history:
            totals[name] += quantity if action == "add" else -quantity
        return dict(totals)


def restock(inventory, orders):
    for name, quantity, price in orders:
        inventory.add(name, quantity, price)
    return inventory.value()

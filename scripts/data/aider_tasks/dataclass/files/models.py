from datetime import date


class LineItem:
    def __init__(self, sku, description, quantity, unit_price):
        self.sku = sku
        self.description = description
        self.quantity = quantity
        self.unit_price = unit_price

    def __repr__(self):
        return (f"LineItem(sku={self.sku!r}, description={self.description!r}, "
                f"quantity={self.quantity!r}, unit_price={self.unit_price!r})")

    def total(self):
        return self.quantity * self.unit_price


class Order:
    def __init__(self, number, customer, placed, items):
        self.number = number
        self.customer = customer
        self.placed = placed
        self.items = items

    def __repr__(self):
        return (f"Order(number={self.number!r}, customer={self.customer!r}, "
                f"placed={self.placed!r}, items={self.items!r})")

    def total(self):
        return sum(item.total() for item in self.items)

    def is_overdue(self, today=None):
        today = today or date.today()
        return (today - self.placed).days > 30

    def skus(self):
        return sorted({item.sku for item in self.items})
